//! The web console's page, script and style, embedded in the binary (nothing is
//! fetched at run time, there is no build step). The page calls the documented
//! API like any client (docs/openapi.yaml); see [`crate::signin`] for how a
//! browser signs in.

use axum::http::header;
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("../console/index.html");
const APP_JS: &str = include_str!("../console/app.js");
const STYLE: &str = include_str!("../console/style.css");

/// Only this server's own files run or load, the page cannot be framed, and
/// nothing leaks in a Referer.
fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

pub async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX)
}

pub async fn app_js() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS)
}

pub async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}
