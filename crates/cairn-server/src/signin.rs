//! Sign-in sessions for the web console: a browser signs in once with a token or a
//! user name and password ([`crate::users`]) and then carries a cookie instead.
//!
//! The session lives in the server's memory only (a restart signs everyone out) and
//! holds the token the user presented, or the user's name, so every request is
//! still decided by the token or the user's entry as they are now: a token removed
//! with `cairn serve token remove` (a user with `cairn serve user remove`) ends its
//! sessions at once. The cookie is `HttpOnly` (scripts cannot read it), `SameSite=Strict` and,
//! over TLS, `Secure`. A request authenticated by the cookie that changes anything
//! (any method but GET and HEAD) must also carry the session's CSRF token in
//! `X-CSRF-Token`, which only the signed-in page learned (from the sign-in answer);
//! a request with `Authorization: Bearer` never uses the cookie. The layer
//! [`cookie_auth`] turns a valid session into that header (`Bearer <token>`, or
//! `Session <id>` for a user, which [`crate::api::authenticate`] resolves), so the
//! API has one way to decide, and the console no back door.

use crate::App;
use crate::api::ApiError;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The cookie's name.
pub const COOKIE: &str = "cairn_session";
/// The header that must repeat the session's CSRF token.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// At most this many live sessions (each needs a valid token to make). Past it a
/// new sign-in ends the least recently used session of whoever holds the most, so
/// that many tokens signing in over and over cannot keep an administrator out.
const MAX_SESSIONS: usize = 10_000;
/// At most this many per token or user: a new sign-in past it ends that one's
/// least recently used session. One token signing in over and over (QA r13: ten
/// thousand times in 1.6 s) so takes only its own sessions' places, not everyone's.
pub const MAX_PER_IDENTITY: usize = 20;

/// Who signed in.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Identity {
    /// The token presented at sign-in, used for every request of the session.
    Token(String),
    /// A console user, by name, with the password hash of its entry at sign-in:
    /// a new password, or the user removed and added again, ends the session.
    User(String, String),
}

impl Identity {
    /// The same token, or the same user name (whatever the password hash).
    fn same_principal(&self, other: &Identity) -> bool {
        match (self, other) {
            (Identity::Token(a), Identity::Token(b)) => a == b,
            (Identity::User(a, _), Identity::User(b, _)) => a == b,
            _ => false,
        }
    }
}

struct SignIn {
    who: Identity,
    csrf: String,
    created: Instant,
    seen: Instant,
}

pub struct SignIns {
    map: Mutex<HashMap<String, SignIn>>,
    /// A session not used for this long ends.
    idle: Duration,
    /// Nor does any live longer than this.
    max_age: Duration,
    /// [`MAX_SESSIONS`] (fewer in tests).
    max_sessions: usize,
    /// Sessions [`Self::retain`] ended, with why, for the answer to their
    /// cookie (QA r41: the sweep ended them within a second, and from then on
    /// they heard only the generic "session ended"). At most [`MAX_SESSIONS`],
    /// each kept for the sessions' longest life.
    ended: Mutex<HashMap<String, (&'static str, Instant)>>,
}

/// Why a session of a token that was removed or expired ended.
pub const TOKEN_GONE: &str =
    "the token this session signed in with was removed or expired: sign in again";
/// Why a session of a user that was removed, or whose password changed, ended.
pub const USER_GONE: &str =
    "the user this session signed in as was removed, or its password changed: sign in again";

fn random_hex() -> String {
    hex::encode(cairn_format::envelope::random_bytes::<32>())
}

/// Compares in time that does not depend on where the strings differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl SignIns {
    pub fn new(idle: Duration, max_age: Duration) -> SignIns {
        SignIns {
            map: Mutex::new(HashMap::new()),
            idle,
            max_age,
            max_sessions: MAX_SESSIONS,
            ended: Mutex::new(HashMap::new()),
        }
    }

    /// Ends session `id` for the reason `why`, which its cookie is then told.
    pub fn end(&self, id: &str, why: &'static str) {
        self.remove(id);
        let mut ended = self.ended.lock().unwrap_or_else(|e| e.into_inner());
        if ended.len() < self.max_sessions {
            ended.insert(id.to_string(), (why, Instant::now()));
        }
    }

    /// Why session `id` ended, when [`Self::retain`] or [`Self::end`] ended it
    /// lately.
    pub fn ended(&self, id: &str) -> Option<&'static str> {
        let mut ended = self.ended.lock().unwrap_or_else(|e| e.into_inner());
        // As long as the session could have lived: its cookie may come back
        // any time until then.
        let max_age = self.max_age;
        ended.retain(|_, (_, at)| at.elapsed() < max_age);
        ended.get(id).map(|(why, _)| *why)
    }

    pub fn idle(&self) -> Duration {
        self.idle
    }

    fn live(&self, s: &SignIn) -> bool {
        s.seen.elapsed() < self.idle && s.created.elapsed() < self.max_age
    }

    /// A new session for `who` (already authenticated): its id and CSRF token.
    pub fn create(&self, who: Identity) -> Option<(String, String)> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let mut own: Vec<(Instant, String)> = (map.iter())
            .filter(|(_, s)| s.who.same_principal(&who))
            .map(|(id, s)| (s.seen, id.clone()))
            .collect();
        if own.len() >= MAX_PER_IDENTITY {
            own.sort();
            for (_, id) in &own[..=own.len() - MAX_PER_IDENTITY] {
                map.remove(id);
            }
        }
        if map.len() >= self.max_sessions {
            map.retain(|_, s| self.live(s));
        }
        while map.len() >= self.max_sessions {
            let id = Self::busiest_oldest(&map)?;
            map.remove(&id);
        }
        let (id, csrf) = (random_hex(), random_hex());
        let now = Instant::now();
        map.insert(
            id.clone(),
            SignIn {
                who,
                csrf: csrf.clone(),
                created: now,
                seen: now,
            },
        );
        Some((id, csrf))
    }

    /// The least recently used session of the identity that holds the most (of
    /// those that hold as many, the one whose such session is oldest).
    fn busiest_oldest(map: &HashMap<String, SignIn>) -> Option<String> {
        let principal = |w: &Identity| match w {
            Identity::Token(t) => (0u8, t.clone()),
            Identity::User(n, _) => (1u8, n.clone()),
        };
        let mut held: HashMap<(u8, String), (usize, Instant, &String)> = HashMap::new();
        for (id, s) in map {
            let e = held.entry(principal(&s.who)).or_insert((0, s.seen, id));
            e.0 += 1;
            if s.seen <= e.1 {
                (e.1, e.2) = (s.seen, id);
            }
        }
        held.into_values()
            .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
            .map(|(_, _, id)| id.clone())
    }

    /// The live session `id`: who and its CSRF token (and it counts as used).
    pub fn get(&self, id: &str) -> Option<(Identity, String)> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let live = map.get(id).is_some_and(|s| self.live(s));
        if !live {
            map.remove(id);
            return None;
        }
        let s = map.get_mut(id)?;
        s.seen = Instant::now();
        Some((s.who.clone(), s.csrf.clone()))
    }

    /// Ends every session whose identity `keep` refuses, with why (a removed
    /// token or user, a changed password), so that they stop counting at once,
    /// not when they next are used or go idle; their cookies are then answered
    /// with why ([`Self::ended`]). Returns how many ended.
    pub fn retain(&self, keep: impl Fn(&Identity) -> Result<(), &'static str>) -> usize {
        // Decided outside the lock (each answer reads the token or user file),
        // once per identity.
        let who: std::collections::HashSet<Identity> =
            (self.map.lock().unwrap_or_else(|e| e.into_inner()))
                .values()
                .map(|s| s.who.clone())
                .collect();
        let refused: HashMap<Identity, &'static str> = who
            .into_iter()
            .filter_map(|w| keep(&w).err().map(|why| (w, why)))
            .collect();
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let before = map.len();
        let mut gone = Vec::new();
        map.retain(|id, s| match refused.get(&s.who) {
            Some(why) => {
                gone.push((id.clone(), *why));
                false
            }
            None => self.live(s),
        });
        let n = before - map.len();
        drop(map);
        let mut ended = self.ended.lock().unwrap_or_else(|e| e.into_inner());
        for (id, why) in gone {
            if ended.len() >= self.max_sessions {
                break;
            }
            ended.insert(id, (why, Instant::now()));
        }
        n
    }

    pub fn remove(&self, id: &str) {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
    }
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim().to_string())
}

/// The answer to a cookie whose session has ended.
pub fn expired() -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "session_expired",
        "the session ended (signed out, unused for too long, or the server restarted): \
         sign in again",
    )
}

/// The layer in front of every route: a request with the session cookie and no
/// `Authorization` gets its session's token as `Authorization: Bearer`, after the
/// CSRF check for anything but GET and HEAD. An ended session is refused with
/// `session_expired` on the API (except `/v1/session`, where one signs in again).
pub async fn cookie_auth(State(app): State<Arc<App>>, mut req: Request, next: Next) -> Response {
    if req.headers().contains_key(header::AUTHORIZATION) {
        return next.run(req).await;
    }
    let Some(id) = cookie(req.headers(), COOKIE) else {
        return next.run(req).await;
    };
    let signing_in = req.uri().path() == "/v1/session";
    if signing_in && req.method() == Method::POST {
        // A new sign-in replaces whatever session the browser had.
        return next.run(req).await;
    }
    let Some((who, csrf)) = app.signins.get(&id) else {
        // The page itself (and /metrics, /healthz) loads whatever the cookie: a
        // browser back after a restart must get the sign-in form, not an error.
        if !req.uri().path().starts_with("/v1/") {
            return next.run(req).await;
        }
        // Ended for a reason the server knows: said, on `/v1/session` too (the
        // page asks there when it loads, and shows it beside the sign-in form).
        if let Some(why) = app.signins.ended(&id) {
            return ApiError::new(StatusCode::UNAUTHORIZED, "session_expired", why).into_response();
        }
        if signing_in {
            return next.run(req).await;
        }
        return expired().into_response();
    };
    if !matches!(*req.method(), Method::GET | Method::HEAD) {
        let sent = req
            .headers()
            .get(CSRF_HEADER)
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        if !same(sent, csrf.as_bytes()) {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                "csrf",
                "missing or wrong X-CSRF-Token: a page of this console must send it with every change",
            )
            .into_response();
        }
    }
    // A removed token's session is over, said as such (the token's own answer,
    // "unknown or removed token", read as a wrong sign-in to QA).
    if let Identity::Token(token) = &who
        && matches!(
            app.tokens.authenticate(token),
            Ok(None) | Err(crate::tokens::TokenError::Expired { .. })
        )
    {
        app.signins.end(&id, TOKEN_GONE);
        return ApiError::new(StatusCode::UNAUTHORIZED, "session_expired", TOKEN_GONE)
            .into_response();
    }
    let value = match who {
        Identity::Token(token) => format!("Bearer {token}"),
        Identity::User(..) => format!("Session {id}"),
    };
    match value.parse() {
        Ok(v) => {
            req.headers_mut().insert(header::AUTHORIZATION, v);
        }
        Err(_) => {
            return ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "unusable token")
                .into_response();
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_end_when_idle_or_removed() {
        let s = SignIns::new(Duration::from_millis(200), Duration::from_secs(60));
        let (id, csrf) = s.create(Identity::Token("cairn_x_y".into())).unwrap();
        assert_eq!(
            s.get(&id),
            Some((Identity::Token("cairn_x_y".into()), csrf.clone()))
        );
        assert_eq!(s.get("nope"), None);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(s.get(&id), None, "idle too long");
        let (id, _) = s.create(Identity::User("ann".into(), "h".into())).unwrap();
        s.remove(&id);
        assert_eq!(s.get(&id), None);
        let old = SignIns::new(Duration::from_secs(60), Duration::from_millis(100));
        let (id, _) = old
            .create(Identity::User("ann".into(), "h".into()))
            .unwrap();
        std::thread::sleep(Duration::from_millis(150));
        assert_eq!(old.get(&id), None, "older than the maximum age");
    }

    /// One token signing in over and over ends its own oldest sessions, never
    /// another's; sessions whose identity is refused end at once.
    #[test]
    fn one_identity_cannot_take_every_place() {
        let s = SignIns::new(Duration::from_secs(60), Duration::from_secs(60));
        let (ann, _) = s.create(Identity::User("ann".into(), "h".into())).unwrap();
        let flood = Identity::Token("cairn_x_y".into());
        let ids: Vec<String> = (0..MAX_PER_IDENTITY * 3)
            .map(|_| {
                std::thread::sleep(Duration::from_micros(50));
                s.create(flood.clone()).unwrap().0
            })
            .collect();
        let live = ids.iter().filter(|id| s.get(id).is_some()).count();
        assert_eq!(live, MAX_PER_IDENTITY);
        // The newest are the ones kept.
        assert!(s.get(ids.last().unwrap()).is_some() && s.get(&ids[0]).is_none());
        assert!(s.get(&ann).is_some(), "another's session is untouched");
        let ended = s.retain(|w| if *w == flood { Err(TOKEN_GONE) } else { Ok(()) });
        assert_eq!(ended, MAX_PER_IDENTITY);
        assert!(s.get(ids.last().unwrap()).is_none());
        assert!(s.get(&ann).is_some());
        // Its cookie is told why (QA r41: only "the session ended").
        assert_eq!(s.ended(ids.last().unwrap()), Some(TOKEN_GONE));
        assert_eq!(s.ended(&ids[0]), None, "ended before, for another reason");
        assert_eq!(s.ended(&ann), None);
    }

    /// Full, a new sign-in ends the oldest session of whoever holds the most:
    /// many tokens signing in over and over cannot keep anyone out.
    #[test]
    fn many_identities_cannot_keep_another_out() {
        let mut s = SignIns::new(Duration::from_secs(60), Duration::from_secs(60));
        s.max_sessions = 30;
        let (ann, _) = s.create(Identity::User("ann".into(), "h".into())).unwrap();
        let mut first = Vec::new();
        for round in 0..3 {
            for t in 0..10 {
                std::thread::sleep(Duration::from_micros(50));
                let (id, _) = s.create(Identity::Token(format!("cairn_t{t}"))).unwrap();
                if round == 0 {
                    first.push(id);
                }
            }
        }
        // 31 asked for, 30 places: one token's oldest went, not ann's.
        assert!(s.get(&ann).is_some());
        assert!(s.get(&first[0]).is_none(), "the busiest's oldest ended");
        let (bob, _) = s.create(Identity::User("bob".into(), "h".into())).unwrap();
        assert!(s.get(&bob).is_some() && s.get(&ann).is_some());
        let live = s.map.lock().unwrap().len();
        assert_eq!(live, 30);
    }

    #[test]
    fn cookies_and_comparisons() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            "a=1; cairn_session=abc ; b=2".parse().unwrap(),
        );
        assert_eq!(cookie(&h, COOKIE).as_deref(), Some("abc"));
        assert_eq!(cookie(&h, "c"), None);
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd") && !same(b"abc", b"ab"));
    }
}
