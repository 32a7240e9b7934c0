//! Which `http://` proxy, if any, carries the connections to the API server, as client-go decides;
//! ureq never reads the environment itself, as its NO_PROXY is not Go's.

use super::{invalid, ConfigError};
use std::fmt;
use std::net::IpAddr;

/// The proxy variables of the environment; its `Debug` leaves out a proxy URL's credentials.
#[derive(Clone, Default)]
pub struct ProxyEnv {
    pub https_proxy: Option<String>,
    pub http_proxy: Option<String>,
    pub no_proxy: Option<String>,
}

impl fmt::Debug for ProxyEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = |v: &Option<String>| v.as_deref().map(without_credentials);
        f.debug_struct("ProxyEnv")
            .field("https_proxy", &shown(&self.https_proxy))
            .field("http_proxy", &shown(&self.http_proxy))
            .field("no_proxy", &self.no_proxy)
            .finish()
    }
}

/// `url` with any `user:password@` cut out of its authority, for `Debug`.
fn without_credentials(url: &str) -> String {
    let start = url.find("://").map_or(0, |i| i + 3);
    let end = url[start..].find('/').map_or(url.len(), |i| start + i);
    match url[start..end].rfind('@') {
        Some(at) => format!("{}{}", &url[..start], &url[start + at + 1..]),
        None => url.to_string(),
    }
}

impl ProxyEnv {
    /// From the process environment: `HTTPS_PROXY` before `https_proxy`, as Go reads them.
    pub fn from_process() -> ProxyEnv {
        let var = |upper: &str| {
            [upper.to_string(), upper.to_ascii_lowercase()]
                .iter()
                .find_map(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
        };
        ProxyEnv {
            https_proxy: var("HTTPS_PROXY"),
            http_proxy: var("HTTP_PROXY"),
            no_proxy: var("NO_PROXY"),
        }
    }
}

/// A proxy to reach the API server through; only [`Proxy::shown`] may reach a log line.
#[derive(Clone)]
pub struct Proxy {
    /// For ureq (and the e2e harness's client); its `Debug` shows the password.
    pub ureq: ureq::Proxy,
    /// `http://host:port`; for logs and messages.
    pub shown: String,
}

impl fmt::Debug for Proxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

/// The cluster's `proxy-url`, set at `origin`, for any server (client-go's `rest.Config.Proxy`).
pub(super) fn from_kubeconfig(url: &str, origin: &str) -> Result<Proxy, ConfigError> {
    parse(url, false).map_err(|problem| invalid(format!("{origin}, proxy-url"), problem))
}

/// The environment's proxy for `server`, as Go's `http.ProxyFromEnvironment` chooses it.
pub(super) fn from_env(server: &str, env: &ProxyEnv) -> Result<Option<Proxy>, ConfigError> {
    let (var, value) = if server.starts_with("https://") {
        ("HTTPS_PROXY", &env.https_proxy)
    } else {
        ("HTTP_PROXY", &env.http_proxy)
    };
    let Some(value) = value else {
        return Ok(None);
    };
    let uri = server.parse().unwrap_or_default();
    let (host, port) = host_and_port(&uri);
    let host = host.to_ascii_lowercase();
    // Go's `useProxy`: never for `localhost` or a loopback address.
    let loopback = host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if loopback || no_proxy_matches(env.no_proxy.as_deref(), &host, port) {
        return Ok(None);
    }
    let proxy = parse(value, true).map_err(|p| invalid(format!("environment variable {var}"), p));
    proxy.map(Some)
}

/// An `http://[user:password@]host[:port]` proxy URL (bare from the environment, as in Go).
/// A message never repeats the URL: it may hold a password.
fn parse(url: &str, bare_is_http: bool) -> Result<Proxy, String> {
    let url = url.trim();
    let rest = match url.split_once("://") {
        Some(("http", rest)) => rest,
        Some((scheme, _)) => {
            return Err(format!(
                "a {scheme}:// proxy is not supported; only http:// proxies are (HTTP CONNECT)"
            ))
        }
        None if bare_is_http => url,
        None => return Err("not a URL: want http://HOST:PORT".into()),
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let (userinfo, host_port) = match authority.rsplit_once('@') {
        Some((userinfo, hp)) => (Some(userinfo), hp),
        None => (None, authority),
    };
    if host_port.starts_with('[') {
        return Err("an IPv6 address as proxy host is not supported; use a host name".into());
    }
    let (host, port) = match host_port.split_once(':') {
        Some((h, p)) => (h, p.parse::<u16>().map_err(|_| "invalid port")?),
        None => (host_port, 80),
    };
    if host.is_empty() {
        return Err("no proxy host".into());
    }
    let mut ureq = ureq::Proxy::builder(ureq::ProxyProtocol::Http)
        .host(host)
        .port(port);
    if let Some(userinfo) = userinfo {
        let (user, password) = credentials(userinfo)?;
        ureq = ureq.username(&user).password(&password);
    }
    let ureq = ureq
        .build()
        .map_err(|_| "not a valid proxy URL (want http://[USER:PASSWORD@]HOST[:PORT])")?;
    Ok(Proxy {
        ureq,
        shown: format!("http://{host}:{port}"),
    })
}

/// The user and password of `user[:password]`, percent-decoded as Go's `url.Parse` does.
fn credentials(userinfo: &str) -> Result<(String, String), String> {
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let decode = |part: &str| -> Result<String, String> {
        // Go's url.Parse refuses a `%` not followed by two hex digits; so do we.
        let bytes = part.as_bytes();
        for (i, _) in part.match_indices('%') {
            let hex = bytes.get(i + 1..i + 3).unwrap_or_default();
            if hex.len() != 2 || !hex.iter().all(u8::is_ascii_hexdigit) {
                return Err("the proxy's user or password has a `%` that is no percent-escape (write %25 for a `%`)".into());
            }
        }
        let decoded = percent_encoding::percent_decode_str(part).decode_utf8();
        let decoded =
            decoded.map_err(|_| "the proxy's user or password is not UTF-8 once decoded")?;
        Ok(decoded.into_owned())
    };
    Ok((decode(user)?, decode(password)?))
}

/// The URL's host, an IPv6 address without the brackets a URL puts around it, and its port.
pub(crate) fn host_and_port(uri: &ureq::http::Uri) -> (&str, u16) {
    let host = uri.host().unwrap_or_default();
    let http = uri.scheme_str() == Some("http");
    let port = uri.port_u16().unwrap_or(if http { 80 } else { 443 });
    (host.trim_start_matches('[').trim_end_matches(']'), port)
}

/// Whether `NO_PROXY` exempts `host:port`, as Go's `httpproxy` reads it: `*`, addresses, CIDRs,
/// `example.com` (and subdomains), `.example.com` or `*.example.com`, each maybe with `:PORT`.
fn no_proxy_matches(no_proxy: Option<&str>, host: &str, port: u16) -> bool {
    let ip = host.parse::<IpAddr>().ok();
    no_proxy
        .unwrap_or_default()
        .split(',')
        .map(|e| e.trim().to_ascii_lowercase())
        .filter(|e| !e.is_empty())
        .any(|entry| {
            if entry == "*" {
                return true;
            }
            if let Some((net, bits)) = entry.split_once('/') {
                return match (net.parse::<IpAddr>(), bits.parse::<u32>(), ip) {
                    (Ok(net), Ok(bits), Some(ip)) => in_cidr(ip, net, bits),
                    _ => false,
                };
            }
            let (name, want_port) = split_port(&entry);
            // Compared as text, as Go does: `host:abc` names no port and matches none.
            if want_port.is_some_and(|p| p != port.to_string()) {
                return false;
            }
            if let Ok(addr) = name.parse::<IpAddr>() {
                return ip == Some(addr);
            }
            let name = name.strip_prefix("*.").map_or(name, |_| &name[1..]);
            match name.strip_prefix('.') {
                Some(_) => host.ends_with(name),
                None => host == name || host.ends_with(&format!(".{name}")),
            }
        })
}

/// `host:port`, `[v6]:port`, or a bare host or address (an IPv6 one has colons of its own).
fn split_port(entry: &str) -> (&str, Option<&str>) {
    if let Some(rest) = entry.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((addr, port)) => (addr, port.strip_prefix(':')),
            None => (entry, None),
        };
    }
    match entry.split_once(':') {
        // `host:` names no port, and matches any (Go's SplitHostPort gives "").
        Some((h, p)) if !p.contains(':') => (h, Some(p).filter(|p| !p.is_empty())),
        _ => (entry, None),
    }
}

fn in_cidr(ip: IpAddr, net: IpAddr, bits: u32) -> bool {
    match (ip.to_canonical(), net) {
        (IpAddr::V4(ip), IpAddr::V4(net)) if bits <= 32 => {
            let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
            u32::from(ip) & mask == u32::from(net) & mask
        }
        (IpAddr::V6(ip), IpAddr::V6(net)) if bits <= 128 => {
            let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
            u128::from(ip) & mask == u128::from(net) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(https: Option<&str>, http: Option<&str>, no: Option<&str>) -> ProxyEnv {
        ProxyEnv {
            https_proxy: https.map(String::from),
            http_proxy: http.map(String::from),
            no_proxy: no.map(String::from),
        }
    }

    /// The proxy the environment picks for `server`, as shown in logs.
    fn chosen(server: &str, env: &ProxyEnv) -> Option<String> {
        from_env(server, env).unwrap().map(|p| p.shown)
    }

    #[test]
    fn an_https_server_takes_https_proxy_and_an_http_one_http_proxy() {
        let e = env(Some("http://secure:3128"), Some("plain:8080"), None);
        assert_eq!(
            chosen("https://api.example.com:6443", &e).as_deref(),
            Some("http://secure:3128")
        );
        assert_eq!(
            chosen("http://api.example.com", &e).as_deref(),
            Some("http://plain:8080")
        );
        let only_http = env(None, Some("http://plain:8080"), None);
        assert_eq!(chosen("https://api.example.com", &only_http), None);
    }

    #[test]
    fn loopback_servers_never_take_the_environments_proxy() {
        let e = env(Some("http://p:3128"), Some("http://p:3128"), None);
        for server in [
            "https://127.0.0.1:6443",
            "https://127.9.9.9",
            "https://localhost:6443",
            "https://[::1]:6443",
        ] {
            assert_eq!(chosen(server, &e), None, "{server}");
        }
    }

    #[test]
    fn no_proxy_exempts_hosts_domains_addresses_ranges_and_ports_as_go_does() {
        let proxied = |server: &str, no: &str| {
            chosen(server, &env(Some("http://p:3128"), None, Some(no))).is_some()
        };
        assert!(!proxied("https://api.example.com:6443", "*"));
        assert!(!proxied("https://api.example.com", "example.com"));
        assert!(!proxied("https://example.com", "example.com"));
        assert!(!proxied("https://api.example.com", ".example.com"));
        assert!(proxied("https://example.com", ".example.com"));
        assert!(!proxied("https://a.example.com", "*.example.com"));
        assert!(proxied("https://notexample.com", "example.com"));
        assert!(!proxied("https://10.1.2.3:6443", "other, 10.0.0.0/8"));
        assert!(proxied("https://11.1.2.3:6443", "10.0.0.0/8"));
        assert!(!proxied("https://10.1.2.3:6443", "10.1.2.3"));
        assert!(!proxied("https://[fd00::1]:6443", "fd00::/8"));
        assert!(!proxied(
            "https://api.example.com:6443",
            "api.example.com:6443"
        ));
        assert!(proxied(
            "https://api.example.com:443",
            "api.example.com:6443"
        ));
        assert!(!proxied("https://API.Example.com", "api.example.COM"));
        assert!(!proxied("https://api.example.com:6443", "api.example.com:"));
        assert!(proxied(
            "https://api.example.com:6443",
            "api.example.com:abc"
        ));
    }

    #[test]
    fn a_star_without_a_dot_is_no_wildcard_in_no_proxy_as_in_go() {
        let proxied = |server: &str, no: &str| {
            chosen(server, &env(Some("http://p:3128"), None, Some(no))).is_some()
        };
        // Go's httpproxy strips only a leading `*.`; `*foo.com` is a name as written.
        assert!(proxied("https://foo.com", "*foo.com"));
        assert!(proxied("https://a.foo.com", "*foo.com"));
        assert!(proxied("https://barfoo.com", "*foo.com"));
        assert!(!proxied("https://a.*foo.com", "*foo.com"));
        // `*.foo.com` is `.foo.com`: subdomains only.
        assert!(!proxied("https://a.foo.com", "*.foo.com"));
        assert!(proxied("https://foo.com", "*.foo.com"));
    }

    #[test]
    fn proxy_credentials_are_percent_decoded_as_gos_url_parse_does() {
        let p = from_kubeconfig("http://user:p%40ss@proxy:3128", "kubeconfig k").unwrap();
        assert_eq!(p.ureq.username(), Some("user"));
        assert_eq!(p.ureq.password(), Some("p@ss"));
        let p = from_kubeconfig("http://us%65r@proxy:3128", "kubeconfig k").unwrap();
        assert_eq!(p.ureq.username(), Some("user"));
        // ureq sends base64("user:"), the colon without a password too, as Go does.
        assert_eq!(p.ureq.password().unwrap_or_default(), "");
        let e = from_kubeconfig("http://user:s3cret%zz@proxy:3128", "kubeconfig k")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("percent-escape") && e.contains("proxy-url"),
            "{e}"
        );
        assert!(!e.contains("s3cret"), "{e}");
    }

    #[test]
    fn no_debug_output_of_the_proxy_settings_shows_a_password() {
        let e = env(
            Some("http://user:s3cret@secure:3128"),
            Some("user:s3cret@plain:8080/x"),
            Some("example.com"),
        );
        let shown = format!("{e:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(
            shown.contains("http://secure:3128") && shown.contains("plain:8080/x"),
            "{shown}"
        );
        let p = from_env("https://api:6443", &e).unwrap().unwrap();
        assert!(!format!("{p:?}").contains("s3cret"));
    }

    #[test]
    fn the_kubeconfigs_proxy_url_is_used_for_any_server() {
        let p = from_kubeconfig("http://user:s3cret@proxy.corp:3128", "kubeconfig k").unwrap();
        assert_eq!(p.shown, "http://proxy.corp:3128");
        assert_eq!(p.ureq.host(), "proxy.corp");
        assert_eq!(p.ureq.port(), 3128);
        assert_eq!(p.ureq.password(), Some("s3cret"));
        assert!(!format!("{p:?}").contains("s3cret"));
    }

    #[test]
    fn unsupported_or_malformed_proxies_are_refused_without_repeating_the_url() {
        for (url, want) in [
            (
                "socks5://user:s3cret@p:1080",
                "socks5:// proxy is not supported",
            ),
            (
                "https://user:s3cret@p:443",
                "https:// proxy is not supported",
            ),
            ("http://user:s3cret@p:notaport", "invalid port"),
            ("http://user:s3cret@[::1]:3128", "IPv6"),
            ("proxy.corp:3128", "not a URL"),
        ] {
            let e = from_kubeconfig(url, "kubeconfig k")
                .unwrap_err()
                .to_string();
            assert!(e.contains(want) && e.contains("proxy-url"), "{url}: {e}");
            assert!(!e.contains("s3cret"), "{e}");
        }
        let e = from_env(
            "https://api:6443",
            &env(Some("socks5://p:1080"), None, None),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("HTTPS_PROXY"), "{e}");
    }
}
