//! Minimal HTTP/1.1 server side over any byte stream: request parsing (Content-Length and
//! chunked bodies), responses with Content-Length, and chunked streams for watches.

use crate::util;
use std::io::{self, Read, Write};

/// Largest request head accepted.
const MAX_HEAD: usize = 64 * 1024;
/// Largest request body accepted: kube-apiserver's limit is 3 MiB.
pub const MAX_BODY: usize = 3 * 1024 * 1024;

/// Why a request could not be read. None is retried on the same connection: the connection
/// is answered (400/413 where possible) and closed.
#[derive(Debug)]
pub enum HttpError {
    /// The socket failed or closed mid-request.
    Io(io::Error),
    /// Not HTTP/1.x as we understand it.
    Malformed(&'static str),
    /// Head or body over the limits.
    TooLarge,
}

impl From<io::Error> for HttpError {
    fn from(e: io::Error) -> Self {
        HttpError::Io(e)
    }
}

/// One parsed request.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub method: String,
    /// The percent-decoded path, without the query.
    pub path: String,
    /// Decoded query parameters, in order.
    pub query: Vec<(String, String)>,
    /// Headers with lowercase names.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub http10: bool,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The first value of query parameter `name`.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the connection stays open after the response (HTTP/1.1 default).
    pub fn keep_alive(&self) -> bool {
        let conn = self.header("connection").unwrap_or("").to_ascii_lowercase();
        if self.http10 {
            conn.contains("keep-alive")
        } else {
            !conn.contains("close")
        }
    }
}

/// A connection: buffered reads of requests, direct writes of responses.
pub struct Conn<S: Read + Write> {
    stream: S,
    buf: Vec<u8>,
    start: usize,
}

fn reason_phrase(code: u16) -> &'static str {
    match code {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        409 => "Conflict",
        410 => "Gone",
        413 => "Request Entity Too Large",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Unknown",
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

impl<S: Read + Write> Conn<S> {
    pub fn new(stream: S) -> Conn<S> {
        Conn {
            stream,
            buf: Vec::with_capacity(8192),
            start: 0,
        }
    }

    /// Reads more bytes into the buffer; `Ok(false)` on end of stream.
    fn fill(&mut self) -> io::Result<bool> {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk)?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n > 0)
    }

    fn pending(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    /// Reads one line ending in CRLF (chunk sizes, trailers), without the CRLF.
    fn read_line(&mut self) -> Result<String, HttpError> {
        loop {
            if let Some(i) = find(self.pending(), b"\r\n") {
                let line = String::from_utf8_lossy(&self.pending()[..i]).into_owned();
                self.start += i + 2;
                return Ok(line);
            }
            if self.pending().len() > MAX_HEAD {
                return Err(HttpError::TooLarge);
            }
            if !self.fill()? {
                return Err(HttpError::Malformed("unexpected end of stream"));
            }
        }
    }

    /// Takes exactly `n` bytes.
    fn read_exact_buf(&mut self, n: usize) -> Result<Vec<u8>, HttpError> {
        while self.pending().len() < n {
            if !self.fill()? {
                return Err(HttpError::Malformed("unexpected end of body"));
            }
        }
        let out = self.pending()[..n].to_vec();
        self.start += n;
        Ok(out)
    }

    /// Reads the next request. `Ok(None)` when the client closed the connection between
    /// requests.
    pub fn read_request(&mut self) -> Result<Option<Request>, HttpError> {
        let head_end = loop {
            if let Some(i) = find(self.pending(), b"\r\n\r\n") {
                break i;
            }
            if self.pending().len() > MAX_HEAD {
                return Err(HttpError::TooLarge);
            }
            match self.fill() {
                Ok(true) => {}
                Ok(false) if self.pending().is_empty() => return Ok(None),
                Ok(false) => return Err(HttpError::Malformed("truncated request head")),
                Err(e) if self.pending().is_empty() => {
                    // A peer that vanishes between requests is a normal close.
                    log::trace!("connection read ended: {e}");
                    return Ok(None);
                }
                Err(e) => return Err(HttpError::Io(e)),
            }
        };
        let head = String::from_utf8_lossy(&self.pending()[..head_end]).into_owned();
        self.start += head_end + 4;
        let mut lines = head.split("\r\n");
        let request_line = lines.next().unwrap_or("");
        let mut parts = request_line.split(' ');
        let (Some(method), Some(target), Some(version)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Err(HttpError::Malformed("bad request line"));
        };
        if !version.starts_with("HTTP/1.") {
            return Err(HttpError::Malformed("not HTTP/1.x"));
        }
        let mut headers = Vec::new();
        for line in lines {
            let Some((k, v)) = line.split_once(':') else {
                return Err(HttpError::Malformed("bad header line"));
            };
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
        // An absolute-form target (RFC 9112, 3.2.2), as some clients send it through a proxy's
        // tunnel: a server must accept it, and kube-apiserver does.
        let target = match target.split_once("://") {
            Some(("http" | "https", rest)) => rest.find('/').map_or("/", |i| &rest[i..]),
            _ => target,
        };
        let (raw_path, raw_query) = target.split_once('?').unwrap_or((target, ""));
        let mut req = Request {
            method: method.to_string(),
            path: util::percent_decode(raw_path, false),
            query: util::parse_query(raw_query),
            headers,
            body: Vec::new(),
            http10: version == "HTTP/1.0",
        };
        if req
            .header("expect")
            .is_some_and(|e| e.eq_ignore_ascii_case("100-continue"))
        {
            self.stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
            self.stream.flush()?;
        }
        let chunked = req
            .header("transfer-encoding")
            .is_some_and(|t| t.to_ascii_lowercase().contains("chunked"));
        if chunked {
            req.body = self.read_chunked_body()?;
        } else if let Some(len) = req.header("content-length") {
            let n: usize = len
                .parse()
                .map_err(|_| HttpError::Malformed("bad content-length"))?;
            if n > MAX_BODY {
                return Err(HttpError::TooLarge);
            }
            req.body = self.read_exact_buf(n)?;
        }
        Ok(Some(req))
    }

    fn read_chunked_body(&mut self) -> Result<Vec<u8>, HttpError> {
        let mut body = Vec::new();
        loop {
            let line = self.read_line()?;
            let size_text = line.split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(size_text, 16)
                .map_err(|_| HttpError::Malformed("bad chunk size"))?;
            if size == 0 {
                // Trailers, up to the empty line.
                while !self.read_line()?.is_empty() {}
                return Ok(body);
            }
            if body.len() + size > MAX_BODY {
                return Err(HttpError::TooLarge);
            }
            body.extend(self.read_exact_buf(size)?);
            if !self.read_line()?.is_empty() {
                return Err(HttpError::Malformed("chunk not followed by CRLF"));
            }
        }
    }

    fn head(code: u16, extra: &[(&str, String)]) -> Vec<u8> {
        let mut h = format!(
            "HTTP/1.1 {code} {}\r\nCache-Control: no-cache, private\r\nContent-Type: application/json\r\n",
            reason_phrase(code)
        );
        for (k, v) in extra {
            h.push_str(k);
            h.push_str(": ");
            h.push_str(v);
            h.push_str("\r\n");
        }
        h.into_bytes()
    }

    /// Writes a whole JSON response with Content-Length.
    pub fn write_response(
        &mut self,
        code: u16,
        extra: &[(&str, String)],
        body: &[u8],
        close: bool,
    ) -> io::Result<()> {
        let mut head = Self::head(code, extra);
        head.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
        if close {
            head.extend_from_slice(b"Connection: close\r\n");
        }
        head.extend_from_slice(b"\r\n");
        if body.len() < 64 * 1024 {
            // One write, so one TLS record for small responses.
            head.extend_from_slice(body);
            self.stream.write_all(&head)?;
        } else {
            self.stream.write_all(&head)?;
            self.stream.write_all(body)?;
        }
        self.stream.flush()
    }

    /// Starts a `Transfer-Encoding: chunked` JSON response (watch streams).
    pub fn start_chunked(&mut self, code: u16) -> io::Result<()> {
        let mut head = Self::head(code, &[]);
        head.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
        self.stream.write_all(&head)?;
        self.stream.flush()
    }

    /// Writes one chunk and flushes it to the client.
    pub fn write_chunk(&mut self, data: &[u8]) -> io::Result<()> {
        let mut out = Vec::with_capacity(data.len() + 12);
        push_chunk(&mut out, data);
        self.write_chunks(&out)
    }

    /// Writes chunks framed by [`push_chunk`] in one go and flushes them to the client.
    pub fn write_chunks(&mut self, framed: &[u8]) -> io::Result<()> {
        if framed.is_empty() {
            return Ok(());
        }
        self.stream.write_all(framed)?;
        self.stream.flush()
    }

    /// Ends a chunked response cleanly (the zero-length last chunk).
    pub fn end_chunked(&mut self) -> io::Result<()> {
        self.stream.write_all(b"0\r\n\r\n")?;
        self.stream.flush()
    }
}

/// Appends `data` to `out` as one chunk of a chunked response, for [`Conn::write_chunks`];
/// nothing when it is empty (an empty chunk would end the response).
pub fn push_chunk(out: &mut Vec<u8>, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// A fake stream: reads from `input`, collects writes.
    struct Duplex {
        input: Cursor<Vec<u8>>,
        output: Vec<u8>,
    }

    impl Read for Duplex {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            // One byte at a time, to exercise buffering across reads.
            let n = buf.len().min(1);
            self.input.read(&mut buf[..n])
        }
    }

    impl Write for Duplex {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.output.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn conn(input: &str) -> Conn<Duplex> {
        Conn::new(Duplex {
            input: Cursor::new(input.as_bytes().to_vec()),
            output: Vec::new(),
        })
    }

    #[test]
    fn keep_alive_requests_are_read_in_sequence() {
        let mut c = conn(
            "GET /api/v1/pods?labelSelector=a%3Db&limit=2 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n\r\n\
             POST /api/v1/namespaces/default/pods HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
        );
        let a = c.read_request().expect("read").expect("request");
        assert_eq!(a.method, "GET");
        assert_eq!(a.path, "/api/v1/pods");
        assert_eq!(a.param("labelSelector"), Some("a=b"));
        assert_eq!(a.header("authorization"), Some("Bearer t"));
        assert!(a.keep_alive());
        let b = c.read_request().expect("read").expect("request");
        assert_eq!(b.body, b"{}");
        assert!(c.read_request().expect("eof").is_none());
    }

    #[test]
    fn an_absolute_form_target_is_read_as_its_path_and_query() {
        let mut c = conn(
            "GET https://127.0.0.1:6443/api/v1/pods?limit=2 HTTP/1.1\r\nHost: x\r\n\r\n\
             GET http://h HTTP/1.1\r\n\r\n",
        );
        let a = c.read_request().expect("read").expect("request");
        assert_eq!(
            (a.path.as_str(), a.param("limit")),
            ("/api/v1/pods", Some("2"))
        );
        let b = c.read_request().expect("read").expect("request");
        assert_eq!(b.path, "/");
    }

    #[test]
    fn chunked_request_body_is_reassembled() {
        let mut c = conn("PUT /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4;ext=1\r\n\":1}\r\n0\r\n\r\n");
        let r = c.read_request().expect("read").expect("request");
        assert_eq!(r.body, b"{\"a\":1}");
    }

    #[test]
    fn oversized_body_is_refused() {
        let mut c = conn(&format!(
            "POST /x HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            MAX_BODY + 1
        ));
        assert!(matches!(c.read_request(), Err(HttpError::TooLarge)));
    }

    #[test]
    fn chunked_response_ends_with_zero_chunk() {
        let mut c = conn("");
        c.start_chunked(200).expect("head");
        c.write_chunk(b"{}\n").expect("chunk");
        c.end_chunked().expect("end");
        let out = String::from_utf8(c.stream.output.clone()).expect("utf8");
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(out.ends_with("\r\n\r\n3\r\n{}\n\r\n0\r\n\r\n"));
    }
}
