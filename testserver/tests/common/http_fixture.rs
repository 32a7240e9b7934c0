//! The recorded `.http` fixtures (tests/fixtures/SET/NN-name.http): a request, the raw
//! response, and for watches a `### what happened` note.

use std::path::PathBuf;

/// One `.http` file.
#[derive(Debug, Clone)]
pub struct Fixture {
    pub name: String,
    /// The `### what happened` section of a watch recording ("" when there is none).
    pub what: String,
    pub method: String,
    pub path: String,
    pub content_type: Option<String>,
    pub body: String,
    pub status: u16,
    /// The response's `Warning` headers, in order.
    pub warnings: Vec<String>,
    pub response: String,
}

/// `tests/fixtures/SET` of the repository.
fn dir(set: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(set)
}

/// Splits a section into (first line, headers, body).
fn split_section(text: &str) -> (String, Vec<(String, String)>, String) {
    let mut lines = text.lines();
    let first = lines.next().unwrap_or("").trim().to_string();
    let mut headers = Vec::new();
    let mut body = Vec::new();
    let mut in_body = false;
    for line in lines {
        if in_body {
            body.push(line);
        } else if line.trim().is_empty() {
            in_body = true;
        } else if let Some((k, v)) = line.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    (first, headers, body.join("\n").trim().to_string())
}

/// Parses one `.http` file's text.
pub fn parse(name: &str, text: &str) -> Fixture {
    let what = text
        .split_once("### what happened")
        .and_then(|(_, rest)| rest.split("###").next())
        .map_or_else(String::new, |w| w.trim().to_string());
    let req_start = text.find("### request").expect("request section") + "### request".len();
    let resp_marker = text.find("### response").expect("response section");
    let request = &text[req_start..resp_marker];
    let response = &text[resp_marker..];
    let response = &response[response.find('\n').map_or(response.len(), |i| i + 1)..];
    let (line, headers, body) = split_section(request.trim_start_matches('\n'));
    let (method, path) = line.split_once(' ').expect("request line");
    let (status_line, response_headers, response_body) = split_section(response);
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    Fixture {
        name: name.to_string(),
        what,
        method: method.to_string(),
        path: path.to_string(),
        content_type: headers
            .iter()
            .find(|(k, _)| k == "content-type")
            .map(|(_, v)| v.clone()),
        body,
        status,
        warnings: response_headers
            .into_iter()
            .filter(|(k, _)| k == "warning")
            .map(|(_, v)| v)
            .collect(),
        response: response_body,
    }
}

/// Every `.http` file of fixture set `set`, in name order.
pub fn load(set: &str) -> Vec<Fixture> {
    let mut names: Vec<String> = std::fs::read_dir(dir(set))
        .expect("fixtures dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".http"))
        .collect();
    names.sort();
    names
        .iter()
        .map(|n| {
            parse(
                n,
                &std::fs::read_to_string(dir(set).join(n)).expect("read fixture"),
            )
        })
        .collect()
}
