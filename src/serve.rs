//! The operator's own small HTTP endpoints: `/metrics` (Prometheus text) and the `/healthz` and
//! `/readyz` probes the Deployment points the kubelet at.
//!
//! One thread per listening address, one request per connection: scrapes and probes are a
//! few per minute, so plain blocking I/O is all this needs.

use crate::metrics;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A watch that has not heard from the server for this long makes the operator unready: longer
/// than a watch's own timeout (at most 230 s) plus the client's grace, so a healthy but quiet
/// cluster never trips it.
pub const MAX_WATCH_SILENCE: Duration = Duration::from_secs(300);

/// What the probes report on.
#[derive(Default)]
pub struct Health {
    /// Watchers that completed their first list.
    pub synced: AtomicUsize,
    /// Set when a worker or watcher thread died.
    pub dead: AtomicBool,
    /// Resources watched, one watcher each.
    pub resources: Vec<&'static str>,
}

impl Health {
    pub fn new(resources: Vec<&'static str>) -> Health {
        Health {
            resources,
            ..Default::default()
        }
    }

    /// Live unless a thread died.
    pub fn live(&self) -> Result<(), String> {
        if self.dead.load(Ordering::Relaxed) {
            return Err("a worker thread died".into());
        }
        Ok(())
    }

    /// Ready once every first list completed and while every watch hears from the server.
    pub fn ready(&self) -> Result<(), String> {
        self.live()?;
        let (synced, all) = (self.synced.load(Ordering::Relaxed), self.resources.len());
        if synced < all {
            return Err(format!(
                "{synced} of {all} watches have completed their first list"
            ));
        }
        for r in &self.resources {
            match metrics::watch_silence(r) {
                Some(d) if d > MAX_WATCH_SILENCE => {
                    return Err(format!("{r} watch silent for {}s", d.as_secs()))
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Parses a bind address as controller-runtime takes it: `:8080` means every interface,
/// `0` disables the endpoint.
pub fn parse_bind(s: &str) -> Result<Option<SocketAddr>, String> {
    if s == "0" || s.is_empty() {
        return Ok(None);
    }
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_string()
    };
    full.parse()
        .map(Some)
        .map_err(|_| format!("invalid bind address {s:?} (want HOST:PORT, :PORT or 0)"))
}

/// Which endpoints a listener serves.
#[derive(Clone, Copy)]
pub enum Endpoints {
    Metrics,
    Probes,
}

/// Binds `addr` and serves on a thread of its own. A bind failure is returned: a port taken by
/// someone else is a configuration error the user must see at start.
pub fn spawn(
    addr: SocketAddr,
    what: Endpoints,
    health: Arc<Health>,
    host: String,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    std::thread::Builder::new()
        .name("http".into())
        .spawn(move || {
            for conn in listener.incoming().flatten() {
                let _ = handle(conn, what, &health, &host);
            }
        })?;
    Ok(local)
}

fn handle(
    mut conn: TcpStream,
    what: Endpoints,
    health: &Health,
    host: &str,
) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // Skip headers; we answer every request the same way whatever it sends.
    let mut line = String::new();
    while reader.read_line(&mut line)? > 2 {
        line.clear();
    }
    let path = request_line.split_whitespace().nth(1).unwrap_or("/");
    let path = path.split('?').next().unwrap_or(path);
    let (code, ctype, body) = match (what, path) {
        (Endpoints::Metrics, "/metrics") => (
            200,
            "text/plain; version=0.0.4; charset=utf-8",
            metrics::render(host),
        ),
        (Endpoints::Probes, "/healthz" | "/livez") => verdict(health.live()),
        (Endpoints::Probes, "/readyz") => verdict(health.ready()),
        _ => (404, "text/plain", "not found\n".to_string()),
    };
    let reason = match code {
        200 => "OK",
        404 => "Not Found",
        _ => "Service Unavailable",
    };
    write!(
        conn,
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    conn.flush()
}

fn verdict(r: Result<(), String>) -> (u16, &'static str, String) {
    match r {
        Ok(()) => (200, "text/plain", "ok\n".into()),
        Err(e) => (503, "text/plain", format!("{e}\n")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn bind_addresses_follow_controller_runtime() {
        assert_eq!(
            parse_bind(":8080").unwrap(),
            Some("0.0.0.0:8080".parse().unwrap())
        );
        assert_eq!(
            parse_bind("127.0.0.1:9").unwrap(),
            Some("127.0.0.1:9".parse().unwrap())
        );
        assert_eq!(parse_bind("0").unwrap(), None);
        assert!(parse_bind("nonsense").is_err());
    }

    #[test]
    fn probes_turn_ready_after_the_first_lists_and_unlive_when_a_thread_dies() {
        let health = Arc::new(Health::new(vec!["probe-test-resource"]));
        let addr = spawn(
            "127.0.0.1:0".parse().unwrap(),
            Endpoints::Probes,
            health.clone(),
            String::new(),
        )
        .unwrap();
        assert!(get(addr, "/healthz").starts_with("HTTP/1.1 200"));
        let r = get(addr, "/readyz");
        assert!(
            r.starts_with("HTTP/1.1 503") && r.contains("0 of 1 watches"),
            "{r}"
        );
        health.synced.fetch_add(1, Ordering::Relaxed);
        metrics::watch_heard("probe-test-resource");
        assert!(get(addr, "/readyz").starts_with("HTTP/1.1 200"));
        health.dead.store(true, Ordering::Relaxed);
        assert!(get(addr, "/healthz").starts_with("HTTP/1.1 503"));
        assert!(get(addr, "/nope").starts_with("HTTP/1.1 404"));
    }

    #[test]
    fn metrics_endpoint_serves_prometheus_text() {
        let addr = spawn(
            "127.0.0.1:0".parse().unwrap(),
            Endpoints::Metrics,
            Arc::default(),
            "h".into(),
        )
        .unwrap();
        let r = get(addr, "/metrics");
        assert!(
            r.starts_with("HTTP/1.1 200") && r.contains("workqueue_depth"),
            "{r}"
        );
    }
}
