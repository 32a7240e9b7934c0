//! Black-holed connections (`TestServer::blackhole`): connections open at the call go silent
//! for good, idle, in flight or streaming a watch, scoped to one user or not; newer ones are
//! served. Driven over raw TLS connections, one socket each, so a test knows which connection
//! a request travels on (an HTTP client's pool would hide it).

mod common;

use common::{bounded, pod_body, tls_config, Client};
use kube_testserver::{Options, Rule, StallRule, TestServer};
use rustls::{ClientConnection, StreamOwned};
use rustls_pki_types::ServerName;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const PODS: &str = "/api/v1/namespaces/default/pods";

/// How long a silent connection is listened to before the test concludes that nothing comes.
/// The server answers these requests in milliseconds, so silence this long is not slowness.
const QUIET: Duration = Duration::from_millis(1500);

/// What a read on a raw connection found.
#[derive(Debug, PartialEq, Eq)]
enum Heard {
    Bytes(String),
    /// Nothing within the wait, and the connection still open.
    Silence,
    /// The server closed the connection (end of stream or reset).
    Closed(String),
}

/// One TLS connection to the server, used by hand.
struct Raw {
    tls: StreamOwned<ClientConnection, TcpStream>,
    buf: Vec<u8>,
}

impl Raw {
    fn open(server: &TestServer) -> Raw {
        let tcp = TcpStream::connect(("127.0.0.1", server.port())).expect("connect");
        let name = ServerName::try_from("127.0.0.1").expect("server name");
        // Never block for good, whatever the server does.
        tcp.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        let mut conn = ClientConnection::new(tls_config(&server.ca_pem()), name).expect("tls");
        let mut tcp = tcp;
        // The handshake now, so a later write needs no answer from the server.
        while conn.is_handshaking() {
            conn.complete_io(&mut tcp).expect("tls handshake");
        }
        Raw {
            tls: StreamOwned::new(conn, tcp),
            buf: Vec::new(),
        }
    }

    fn send(&mut self, method: &str, path: &str, token: &str, body: Option<&str>) {
        let body = body.unwrap_or("");
        let text = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        self.tls.write_all(text.as_bytes()).expect("send");
        self.tls.flush().expect("flush");
    }

    /// Whatever arrives within `wait`.
    fn hear(&mut self, wait: Duration) -> Heard {
        if !self.buf.is_empty() {
            return Heard::Bytes(String::from_utf8_lossy(&std::mem::take(&mut self.buf)).into());
        }
        self.tls
            .sock
            .set_read_timeout(Some(wait))
            .expect("read timeout");
        let mut chunk = [0u8; 16 * 1024];
        match self.tls.read(&mut chunk) {
            Ok(0) => Heard::Closed("end of stream".into()),
            Ok(n) => Heard::Bytes(String::from_utf8_lossy(&chunk[..n]).into()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Heard::Silence
            }
            Err(e) => Heard::Closed(e.to_string()),
        }
    }

    /// The status code of the next response, reading its whole head and Content-Length body
    /// (a watch's chunked body is left to [`Raw::hear`]).
    fn status(&mut self, wait: Duration) -> u16 {
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.buf[..end]).to_string();
                let code = head
                    .split(' ')
                    .nth(1)
                    .and_then(|c| c.parse().ok())
                    .expect("status line");
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                while self.buf.len() < end + 4 + len {
                    self.fill(wait);
                }
                self.buf.drain(..end + 4 + len);
                return code;
            }
            self.fill(wait);
        }
    }

    fn fill(&mut self, wait: Duration) {
        match self.hear(wait) {
            Heard::Bytes(b) => self.buf.extend_from_slice(b.as_bytes()),
            other => panic!("expected an answer, heard {other:?}"),
        }
    }
}

fn start() -> TestServer {
    let server = TestServer::start(Options {
        // No periodic traffic, so whatever a silenced connection hears was sent after the call.
        bookmark_interval: Duration::from_secs(600),
        ..Options::default()
    })
    .expect("server starts");
    server.add_user("operator", "op-token", vec![Rule::new(&["*"], &["*"])]);
    server
}

#[test]
fn a_black_holed_users_open_connections_go_silent_while_others_and_new_ones_are_served() {
    bounded(60, || {
        let server = start();
        let admin_token = server.admin_token();
        let mut idle = Raw::open(&server);
        idle.send("GET", PODS, "op-token", None);
        assert_eq!(idle.status(QUIET), 200);
        let mut watch = Raw::open(&server);
        watch.send(
            "GET",
            &format!("{PODS}?watch=true&allowWatchBookmarks=true&timeoutSeconds=60"),
            "op-token",
            None,
        );
        assert_eq!(watch.status(QUIET), 200);
        let admin = Client::admin(&server);
        assert_eq!(admin.post(PODS, &pod_body("before", None)).code, 201);
        assert!(
            matches!(watch.hear(QUIET), Heard::Bytes(b) if b.contains("\"before\"")),
            "the watch streams events before"
        );
        // The kubelet's writes to that pod would reach the watch too: wait until it runs, and
        // read them, so what the watch hears after the call can only come after it.
        common::wait_for(
            5,
            "the pod to run",
            || admin.get(&format!("{PODS}/before")).body,
            |p| p["status"]["phase"] == "Running",
        );
        while matches!(watch.hear(Duration::from_millis(300)), Heard::Bytes(_)) {}
        let mut admins = Raw::open(&server);
        admins.send("GET", PODS, &admin_token, None);
        assert_eq!(admins.status(QUIET), 200);

        assert_eq!(server.blackhole(Some("operator")), 2);
        assert_eq!(server.blackholed(), 2);
        assert_eq!(
            server.blackhole(Some("operator")),
            0,
            "silenced connections are not counted twice"
        );

        // The idle connection: a request sent on it gets no answer, and it is not closed.
        idle.send("GET", PODS, "op-token", None);
        // The watch: no event for a new pod, and no end.
        assert_eq!(admin.post(PODS, &pod_body("p", None)).code, 201);
        assert_eq!(idle.hear(QUIET), Heard::Silence);
        assert_eq!(watch.hear(QUIET), Heard::Silence);
        common::wait_for(
            5,
            "the silenced watch to be unregistered",
            || serde_json::json!(server.open_watches()),
            |n| *n == 0,
        );
        // Others, and new connections of the same user, are served.
        admins.send("GET", PODS, &admin_token, None);
        assert_eq!(admins.status(QUIET), 200);
        let mut fresh = Raw::open(&server);
        fresh.send("GET", PODS, "op-token", None);
        assert_eq!(fresh.status(QUIET), 200);
        assert_eq!(Client::new(&server, "op-token").get(PODS).code, 200);
        assert_eq!(server.blackholed(), 2);

        // A dropped server closes them.
        drop(server);
        assert!(matches!(idle.hear(QUIET), Heard::Closed(_)));
        assert!(matches!(watch.hear(QUIET), Heard::Closed(_)));
    });
}

#[test]
fn a_request_in_flight_when_every_connection_is_black_holed_may_take_effect_unanswered() {
    bounded(60, || {
        let server = start();
        // Held before it is handled, so it is in flight when the black hole starts.
        let stall = server.stall(StallRule {
            verb: Some("create".into()),
            ..StallRule::default()
        });
        let mut raw = Raw::open(&server);
        let body = pod_body("in-flight", None).to_string();
        raw.send("POST", PODS, "op-token", Some(&body));
        let mut unused = Raw::open(&server);
        let counted = common::wait_for(
            5,
            "the create to arrive",
            || {
                serde_json::json!(server
                    .request_counts()
                    .get(&("create".to_string(), "pods".to_string()))
                    .copied()
                    .unwrap_or(0))
            },
            |n| *n == 1,
        );
        assert_eq!(counted, 1);
        // Every connection, whoever its user, even one that never carried a request.
        assert_eq!(server.blackhole(None), 2);
        server.lift_stall(stall);
        common::wait_for(
            5,
            "the held create to take effect",
            || serde_json::json!(server.get_json(&format!("{PODS}/in-flight")).is_some()),
            |found| *found == true,
        );
        assert_eq!(raw.hear(QUIET), Heard::Silence, "its answer is never sent");
        unused.send("GET", PODS, "op-token", None);
        assert_eq!(unused.hear(QUIET), Heard::Silence);
        // stop_listening closes them, as a restart does.
        server.stop_listening();
        assert_eq!(server.blackholed(), 0);
        assert!(matches!(raw.hear(QUIET), Heard::Closed(_)));
    });
}
