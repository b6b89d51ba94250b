//! Glob patterns over paths, matched by characters.
//!
//! `*` (any characters but `/`), `**` (as a whole component: any number of
//! components), `?` (one character but `/`), `[...]` and `[!...]` (a class, with
//! ranges), `{a,b}` (either: unlike restic's patterns, where `{` is itself; write
//! `\{` for a literal brace), and `\` escaping the next character. A pattern is
//! matched against the whole path as `ls` prints it: a name that is not UTF-8 has
//! each invalid byte as its stand-in character ([`crate::ops::ls::escape_name`]),
//! so `?` is one character whatever its encoding, and ignoring case folds
//! Unicode, not only ASCII (`Ü` matches `ü`).

use regex::Regex;

/// Whether a pattern (this module's syntax) has a wildcard (`*`, `?`, `[`) not
/// escaped: one without names exactly what [`unescape`] makes of it.
pub fn has_wildcard(component: &[u8]) -> bool {
    let mut bytes = component.iter();
    while let Some(b) = bytes.next() {
        match b {
            b'\\' => {
                bytes.next();
            }
            b'*' | b'?' | b'[' => return true,
            _ => {}
        }
    }
    false
}

/// A pattern without wildcards, its escapes taken away (a lone `\` at the end
/// stays).
pub fn unescape(component: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(component.len());
    let mut bytes = component.iter();
    while let Some(&b) = bytes.next() {
        out.push(if b == b'\\' {
            bytes.next().copied().unwrap_or(b'\\')
        } else {
            b
        });
    }
    out
}

#[derive(Clone, Debug)]
pub struct Glob {
    re: Regex,
}

/// A glob's regex source, anchored, with its case rule.
fn source(pattern: &str, separator: bool, ignore_case: bool) -> Result<String, String> {
    let body = translate(pattern, separator)?;
    let flags = if ignore_case { "(?i)" } else { "" };
    Ok(format!("{flags}^(?s:{body})$"))
}

impl Glob {
    /// `pattern` as a glob; with `separator`, `*`, `?` and classes never match a
    /// `/` (paths); without, they do (a single name has none anyway).
    pub fn new(pattern: &str, separator: bool, ignore_case: bool) -> Result<Glob, String> {
        let re = Regex::new(&source(pattern, separator, ignore_case)?)
            .map_err(|e| format!("pattern {pattern:?}: {e}"))?;
        Ok(Glob { re })
    }

    pub fn is_match(&self, text: &str) -> bool {
        self.re.is_match(text)
    }

    /// Matches a path from the file system (its bytes), as `ls` would print it.
    pub fn is_match_bytes(&self, path: &[u8]) -> bool {
        self.is_match(&as_listed(path))
    }
}

/// Several globs matched in one pass (an exclude file of hundreds of patterns
/// costs one scan of each path, not one per pattern).
#[derive(Clone, Debug, Default)]
pub struct GlobSet {
    set: Option<regex::RegexSet>,
}

impl GlobSet {
    /// Every `(pattern, ignore_case)` as a path glob (`*` stops at `/`).
    pub fn new<'a>(patterns: impl IntoIterator<Item = (&'a str, bool)>) -> Result<GlobSet, String> {
        let mut sources = Vec::new();
        for (p, fold) in patterns {
            let src = source(p, true, fold)?;
            // Each checked alone first, so an error names its pattern.
            Regex::new(&src).map_err(|e| format!("pattern {p:?}: {e}"))?;
            sources.push(src);
        }
        if sources.is_empty() {
            return Ok(GlobSet { set: None });
        }
        let set = regex::RegexSet::new(&sources).map_err(|e| e.to_string())?;
        Ok(GlobSet { set: Some(set) })
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_none()
    }

    pub fn is_match_bytes(&self, path: &[u8]) -> bool {
        let Some(set) = &self.set else {
            return false;
        };
        let listed = as_listed(path);
        set.is_match(&listed) || typed_spelling(&listed).is_some_and(|t| set.is_match(&t))
    }

    /// The position of the last pattern (in the order given) that matches a path
    /// from the file system, or a walk path of a snapshot (in both spellings, see
    /// [`typed_spelling`]).
    pub fn last_match_bytes(&self, path: &[u8]) -> Option<usize> {
        let set = self.set.as_ref()?;
        let listed = as_listed(path);
        let last = set.matches(&listed).iter().next_back();
        match typed_spelling(&listed) {
            Some(t) => last.max(set.matches(&t).iter().next_back()),
            None => last,
        }
    }
}

/// A name holding the characters U+10FF00..U+10FFFF themselves reads, as a walk
/// path, as the stand-ins of their bytes; a pattern typed with those characters
/// is matched against this spelling too, so that it takes what it names (and
/// whatever reads the same), never only the other name. `None` for almost every
/// path: no stand-in (each begins with the byte 0xf4), or the same spelling.
fn typed_spelling(listed: &str) -> Option<String> {
    if !listed.as_bytes().contains(&0xf4) {
        return None;
    }
    crate::ops::ls::unescape_name(listed)
        .map(|bytes| crate::ops::ls::escape_arg(&bytes))
        .filter(|t| t != listed)
}

/// A path's bytes as `ls` prints them: borrowed when UTF-8 (restore and rewrite
/// pass walk paths, already in that form), else with each invalid byte as its
/// stand-in.
fn as_listed(path: &[u8]) -> std::borrow::Cow<'_, str> {
    match std::str::from_utf8(path) {
        Ok(s) => std::borrow::Cow::Borrowed(s),
        Err(_) => std::borrow::Cow::Owned(crate::ops::ls::escape_arg(path)),
    }
}

/// A character in a regex, whatever it is.
fn lit(out: &mut String, c: char) {
    out.push_str(&format!("\\x{{{:X}}}", c as u32));
}

fn translate(pattern: &str, separator: bool) -> Result<String, String> {
    let one = if separator { "[^/]" } else { "." };
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = String::new();
    let mut braces = 0usize;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\\' => {
                let Some(&n) = chars.get(i + 1) else {
                    return Err(format!("pattern {pattern:?} ends with an unfinished \\"));
                };
                lit(&mut out, n);
                i += 2;
                continue;
            }
            '*' if chars.get(i + 1) == Some(&'*') => {
                let start = i == 0 || chars[i - 1] == '/';
                let end = i + 2 == chars.len() || chars[i + 2] == '/';
                if separator && start && end {
                    if i + 2 == chars.len() {
                        // `a/**`: everything below (and `**` alone: anything).
                        out.push_str(".*");
                        i += 2;
                    } else {
                        // `**/`: any number of whole components.
                        out.push_str("(?:.*/)?");
                        i += 3;
                    }
                } else {
                    out.push_str(&format!("{one}*"));
                    i += 2;
                }
                continue;
            }
            '*' => out.push_str(&format!("{one}*")),
            '?' => out.push_str(one),
            '[' => {
                let (class, next) = class(&chars, i, separator)
                    .map_err(|why| format!("pattern {pattern:?}: {why}"))?;
                out.push_str(&class);
                i = next;
                continue;
            }
            '{' => {
                braces += 1;
                out.push_str("(?:");
            }
            ',' if braces > 0 => out.push('|'),
            '}' if braces > 0 => {
                braces -= 1;
                out.push(')');
            }
            c => lit(&mut out, c),
        }
        i += 1;
    }
    if braces > 0 {
        return Err(format!("pattern {pattern:?}: a {{ without its }}"));
    }
    Ok(out)
}

/// The class starting at `chars[start]` (`[`) as a regex class, and where the
/// pattern goes on; or what is wrong with it.
fn class(chars: &[char], start: usize, separator: bool) -> Result<(String, usize), String> {
    let unclosed = || "a [ without its ]".to_string();
    let mut i = start + 1;
    let negated = matches!(chars.get(i), Some('!') | Some('^'));
    if negated {
        i += 1;
    }
    let mut items = String::new();
    let mut first = true;
    loop {
        let c = *chars.get(i).ok_or_else(unclosed)?;
        if c == ']' && !first {
            i += 1;
            break;
        }
        first = false;
        let c = if c == '\\' {
            i += 1;
            *chars.get(i).ok_or_else(unclosed)?
        } else {
            c
        };
        // A range `a-z` (a `-` first or last is itself).
        if chars.get(i + 1) == Some(&'-') && chars.get(i + 2).is_some_and(|&e| e != ']') {
            let mut e = chars[i + 2];
            let mut skip = 3;
            if e == '\\' {
                e = *chars.get(i + 3).ok_or_else(unclosed)?;
                skip = 4;
            }
            if e < c {
                return Err(format!("the range {c}-{e} runs backwards"));
            }
            lit(&mut items, c);
            items.push('-');
            lit(&mut items, e);
            i += skip;
        } else {
            lit(&mut items, c);
            i += 1;
        }
    }
    let class = match (negated, separator) {
        (true, true) => format!("[^/{items}]"),
        (true, false) => format!("[^{items}]"),
        // A class never matches a separator in a path pattern.
        (false, true) => format!("[[{items}]&&[^/]]"),
        (false, false) => format!("[{items}]"),
    };
    Ok((class, i))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, t: &str) -> bool {
        Glob::new(p, true, false).unwrap().is_match(t)
    }

    #[test]
    fn wildcards_match_characters_not_bytes() {
        assert!(m("?n?", "ünï"));
        assert!(!m("??n??", "ünï"));
        assert!(m("[ü]n?", "ünï"));
        assert!(m("*.txt", "ā.txt"));
        assert!(!m("*.txt", "a/b.txt"));
        assert!(Glob::new("ÜNÏ", true, true).unwrap().is_match("ünï"));
        assert!(!Glob::new("ÜNÏ", true, false).unwrap().is_match("ünï"));
    }

    #[test]
    fn components_classes_alternatives_and_escapes() {
        assert!(m("**/x", "x"));
        assert!(m("**/x", "/a/b/x"));
        assert!(m("/a/**", "/a/b/c"));
        assert!(m("/a/**/c", "/a/c"));
        assert!(m("/a/**/c", "/a/b/d/c"));
        assert!(!m("/a/*/c", "/a/b/d/c"));
        assert!(m("[a-c]x", "bx"));
        assert!(!m("[!a-c]x", "bx"));
        assert!(m("[!a-c]x", "dx"));
        assert!(!m("a[/]b", "a/b"));
        assert!(!m("a?b", "a/b"));
        assert!(m("[]]", "]"));
        assert!(m("[a-]", "-"));
        assert!(m("*.{jpg,png}", "x.png"));
        assert!(!m("*.{jpg,png}", "x.gif"));
        assert!(m("\\*", "*"));
        assert!(!m("\\*", "a"));
        assert!(m("a.b", "a.b"));
        assert!(!m("a.b", "axb"));
        assert!(m("(x)+$", "(x)+$"));
        assert!(Glob::new("[abc", true, false).is_err());
        assert!(Glob::new("{a,b", true, false).is_err());
        let e = Glob::new("[z-a]", true, false).unwrap_err();
        assert!(e.contains("backwards"), "{e}");
        // Without the separator rule, `*` crosses `/`.
        assert!(Glob::new("*", false, false).unwrap().is_match("a/b"));
    }

    #[test]
    fn bytes_that_are_not_utf8_match_as_ls_prints_them() {
        let g = Glob::new("/d/?x", true, false).unwrap();
        assert!(g.is_match_bytes(b"/d/\xffx"));
        assert!(!g.is_match_bytes(b"/d/\xff\xfex"));
        let set = GlobSet::new([("**/*.tmp", false)]).unwrap();
        assert!(set.is_match_bytes(b"/a/\xff.tmp"));
        assert!(!set.is_match_bytes(b"/a/x.tmpl"));
    }
}
