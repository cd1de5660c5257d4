//! What an `http` grant allows: a destination (host, optional port), and
//! optionally the methods, the path prefixes and the non-public addresses
//! the destination may be reached with.
//!
//! A grant is written `api.example.com`, `api.example.com:8443`,
//! `*.example.com` (any subdomain, not the apex), `127.0.0.1:8080` or
//! `[::1]:8080`; or as a table that narrows it:
//! `{ host = "api.stripe.com", methods = ["POST"], paths = ["/v1/charges"] }`.
//!
//! Names are resolved by corral, and an address in a loopback, private,
//! link-local (cloud metadata), carrier-grade NAT, multicast or reserved
//! range is refused unless the grant names it: as its host
//! (`127.0.0.1:8080`), or in `addresses = ["10.0.0.0/8"]`. So a wildcard
//! or a name whose DNS an attacker controls cannot reach the host's own
//! network.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use hyper::http::Method;
use hyper::http::uri::Authority;
use ipnet::IpNet;

/// A grant that cannot be applied, naming what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    #[error("`{0}` is not a host such as api.example.com, api.example.com:8443 or *.example.com")]
    NotAHost(String),
    #[error("`{0}` must be a host name or address with an optional port")]
    UserInfo(String),
    #[error("`{0}`: a wildcard needs a domain name")]
    WildcardAddress(String),
    #[error("method `{0}` is not an HTTP method")]
    Method(String),
    #[error(
        "path `{0}` must start with `/` and hold only letters, digits, `/` and -._~!$&'()*+,=:@ (no `%`, `;` or `\\`), with no empty segment or one of dots only"
    )]
    Path(String),
    #[error("`{0}` is not an address or range such as 10.0.0.5, 10.0.0.0/8 or fd00::/8")]
    Address(String),
}

/// One allowed destination: a host (or every subdomain of one) and,
/// optionally, one port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpHost {
    /// Lower-case host; for a wildcard, the suffix after `*.`. An IPv6
    /// address keeps its brackets, as in a URI.
    host: String,
    wildcard: bool,
    port: Option<u16>,
}

impl FromStr for HttpHost {
    type Err = GrantError;

    fn from_str(text: &str) -> Result<Self, GrantError> {
        let (wildcard, rest) = match text.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let authority: Authority = rest
            .parse()
            .map_err(|_| GrantError::NotAHost(text.to_owned()))?;
        if authority.as_str().contains('@') || authority.host().is_empty() {
            return Err(GrantError::UserInfo(text.to_owned()));
        }
        if wildcard && authority.host().starts_with('[') {
            return Err(GrantError::WildcardAddress(text.to_owned()));
        }
        Ok(HttpHost {
            host: authority.host().to_ascii_lowercase(),
            wildcard,
            port: authority.port_u16(),
        })
    }
}

impl fmt::Display for HttpHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.wildcard {
            f.write_str("*.")?;
        }
        f.write_str(&self.host)?;
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

impl HttpHost {
    /// Whether a request to `host` on `port` is within this grant.
    pub(crate) fn allows(&self, host: &str, port: u16) -> bool {
        let host = host.to_ascii_lowercase();
        let host_ok = if self.wildcard {
            host.strip_suffix(&self.host)
                .is_some_and(|prefix| prefix.len() > 1 && prefix.ends_with('.'))
        } else {
            host == self.host
        };
        host_ok && self.port.is_none_or(|p| p == port)
    }

    /// The address this grant is written as, if it is one.
    fn address(&self) -> Option<IpAddr> {
        if self.wildcard {
            return None;
        }
        let bare = self
            .host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(&self.host);
        bare.parse().ok()
    }
}

/// One `http` grant: a destination, narrowed by methods and path prefixes
/// when it lists any, widened to the non-public addresses it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpGrant {
    host: HttpHost,
    methods: Vec<Method>,
    paths: Vec<String>,
    addresses: Vec<IpNet>,
}

impl From<HttpHost> for HttpGrant {
    fn from(host: HttpHost) -> Self {
        HttpGrant {
            host,
            methods: Vec::new(),
            paths: Vec::new(),
            addresses: Vec::new(),
        }
    }
}

impl FromStr for HttpGrant {
    type Err = GrantError;

    fn from_str(text: &str) -> Result<Self, GrantError> {
        text.parse::<HttpHost>().map(HttpGrant::from)
    }
}

impl fmt::Display for HttpGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.host)?;
        if !self.methods.is_empty() {
            let methods: Vec<&str> = self.methods.iter().map(Method::as_str).collect();
            write!(f, " methods {}", methods.join(","))?;
        }
        if !self.paths.is_empty() {
            write!(f, " paths {}", self.paths.join(","))?;
        }
        if !self.addresses.is_empty() {
            let addresses: Vec<String> = self.addresses.iter().map(ToString::to_string).collect();
            write!(f, " addresses {}", addresses.join(","))?;
        }
        Ok(())
    }
}

impl HttpGrant {
    /// Allows only these methods (upper-case, as sent).
    pub fn with_methods<S: AsRef<str>>(
        mut self,
        methods: impl IntoIterator<Item = S>,
    ) -> Result<Self, GrantError> {
        for method in methods {
            let method = method.as_ref();
            let parsed = Method::from_bytes(method.as_bytes())
                .map_err(|_| GrantError::Method(method.to_owned()))?;
            if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
                return Err(GrantError::Method(method.to_owned()));
            }
            self.methods.push(parsed);
        }
        Ok(self)
    }

    /// Allows only paths under these prefixes, matched on `/` boundaries.
    pub fn with_paths<S: AsRef<str>>(
        mut self,
        paths: impl IntoIterator<Item = S>,
    ) -> Result<Self, GrantError> {
        for path in paths {
            let path = path.as_ref();
            if !path.starts_with('/') || !plain_path(path) {
                return Err(GrantError::Path(path.to_owned()));
            }
            self.paths.push(path.trim_end_matches('/').to_owned());
        }
        Ok(self)
    }

    /// Allows these non-public addresses (`10.0.0.5`, `10.0.0.0/8`).
    pub fn with_addresses<S: AsRef<str>>(
        mut self,
        addresses: impl IntoIterator<Item = S>,
    ) -> Result<Self, GrantError> {
        for text in addresses {
            let text = text.as_ref();
            let net = text
                .parse::<IpNet>()
                .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| GrantError::Address(text.to_owned()))?;
            self.addresses.push(net);
        }
        Ok(self)
    }

    pub(crate) fn host(&self) -> &HttpHost {
        &self.host
    }

    /// Whether `method` and `path` (without the query) are within the rule.
    pub(crate) fn allows_request(&self, method: &Method, path: &str) -> bool {
        let method_ok = self.methods.is_empty() || self.methods.contains(method);
        let path_ok = self.paths.is_empty()
            || (plain_path(path)
                && self.paths.iter().any(|prefix| {
                    path.strip_prefix(prefix.as_str())
                        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
                }));
        method_ok && path_ok
    }

    /// Whether this grant reaches `address`: a public address always; any
    /// other only when the grant names it.
    pub(crate) fn reaches(&self, address: IpAddr) -> bool {
        let address = canonical(address);
        special_range(address).is_none()
            || self.host.address().map(canonical) == Some(address)
            || self.addresses.iter().any(|net| net.contains(&address))
    }
}

/// A path that every widely used server reads as corral's prefix check
/// does. Anything a server could read as another path is refused, rather
/// than normalised in the hope of matching the server:
/// - bytes outside RFC 3986's unreserved characters, `/` and the
///   sub-delimiters other than `;`: no percent-escape (so no encoded `.`,
///   `/`, `\`, NUL or overlong UTF-8), no `;` (path parameters, which
///   Tomcat, Jetty and Spring strip: `/a/..;/b` is `/b` there), no
///   backslash (a separator to IIS and some proxies), no space, control or
///   non-ASCII byte;
/// - no segment of dots only (`.`, `..`, and `...`, which some servers
///   fold), and no empty segment (`//`, which servers merge or read as a
///   host) but a final `/`.
fn plain_path(path: &str) -> bool {
    let bytes_ok = path
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~/!$&'()*+,=:@".contains(&b));
    let body = path.strip_prefix('/').unwrap_or(path);
    let body = body.strip_suffix('/').unwrap_or(body);
    bytes_ok
        && (body.is_empty()
            || body
                .split('/')
                .all(|segment| !segment.is_empty() && !segment.bytes().all(|b| b == b'.')))
}

/// An IPv4 address written as IPv6 (`::ffff:127.0.0.1`) is that IPv4 address.
fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// The kind of non-public range `address` is in, if any.
pub(crate) fn special_range(address: IpAddr) -> Option<&'static str> {
    match canonical(address) {
        IpAddr::V4(v4) => special_v4(v4),
        IpAddr::V6(v6) => special_v6(v6),
    }
}

fn special_v4(a: Ipv4Addr) -> Option<&'static str> {
    let [b0, b1, b2, _] = a.octets();
    Some(if a.is_loopback() {
        "loopback"
    } else if a.is_private() {
        "private"
    } else if a.is_link_local() {
        "link-local (where cloud metadata services answer)"
    } else if b0 == 100 && (64..128).contains(&b1) {
        "carrier-grade NAT"
    } else if a.is_unspecified() || b0 == 0 {
        "unspecified"
    } else if a.is_multicast() || a.is_broadcast() {
        "multicast or broadcast"
    } else if b0 >= 240 || (b0 == 192 && b1 == 0 && b2 == 0) || (b0 == 198 && (b1 & 0xfe) == 18) {
        "reserved"
    } else {
        return None;
    })
}

fn special_v6(a: Ipv6Addr) -> Option<&'static str> {
    let first = a.segments()[0];
    Some(if a.is_loopback() {
        "loopback"
    } else if a.is_unspecified() {
        "unspecified"
    } else if first & 0xfe00 == 0xfc00 {
        "private (unique local)"
    } else if first & 0xffc0 == 0xfe80 {
        "link-local"
    } else if a.is_multicast() {
        "multicast"
    } else if a.segments()[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        // NAT64: the IPv4 address inside decides.
        let [.., hi, lo] = a.segments();
        let v4 = Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
        return special_v4(v4);
    } else {
        return None;
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(text: &str) -> HttpGrant {
        text.parse().unwrap()
    }

    #[test]
    fn methods_and_paths_narrow_a_grant() {
        let rule = grant("api.stripe.com")
            .with_methods(["POST"])
            .unwrap()
            .with_paths(["/v1/charges", "/v1/customers/"])
            .unwrap();
        let allows = |m: &str, p: &str| rule.allows_request(&m.parse().unwrap(), p);
        assert!(allows("POST", "/v1/charges"));
        assert!(allows("POST", "/v1/charges/ch_1"));
        assert!(allows("POST", "/v1/customers/cu_1"));
        assert!(!allows("GET", "/v1/charges"), "method");
        assert!(
            !allows("POST", "/v1/chargesX"),
            "a prefix ends on a segment"
        );
        assert!(!allows("POST", "/v1/refunds"));
        assert!(!allows("POST", "/"));
        assert!(allows("POST", "/v1/charges/"), "a final slash");
        assert!(allows("POST", "/v1/charges/ch_1.json"), "a dot in a name");
        assert!(allows("POST", "/v1/customers/a+b@c:d~e=f,g!h$i&j'k(l)m*n"));
        // No rule: everything on the host.
        assert!(grant("api.stripe.com").allows_request(&Method::DELETE, "/x/../y"));
    }

    /// Every spelling a widely used server could read as a path outside
    /// the rule (or the rule's own), under a rule for `/v1/charges`.
    #[test]
    fn paths_a_server_could_read_as_another_path_are_refused() {
        let rule = grant("api.stripe.com").with_paths(["/v1/charges"]).unwrap();
        let refused = [
            // `..` and `.` segments, as written
            "/v1/charges/../refunds",
            "/v1/charges/./../refunds",
            "/v1/charges/.",
            "/v1/charges/..",
            "/v1/charges/...",
            "/v1/charges/..../refunds",
            // percent-encoded dots, slashes, backslashes, NUL; overlong and
            // mixed encodings
            "/v1/charges/%2e%2e/refunds",
            "/v1/charges/%2E%2E/refunds",
            "/v1/charges/.%2e/refunds",
            "/v1/charges/%2e./refunds",
            "/v1/charges/..%2frefunds",
            "/v1/charges/..%2Frefunds",
            "/v1/charges/..%5crefunds",
            "/v1/charges%2f..%2frefunds",
            "/v1/charges/%252e%252e/refunds",
            "/v1/charges/%c0%ae%c0%ae/refunds",
            "/v1/charges/%e0%80%ae%e0%80%ae/refunds",
            "/v1/charges/%00/../refunds",
            "/v1/charges/%u002e%u002e/refunds",
            // path parameters (Tomcat, Jetty, Spring read `..;` as `..`)
            "/v1/charges/..;/refunds",
            "/v1/charges/;/../refunds",
            "/v1/charges;jsessionid=1/../refunds",
            "/v1/charges;/x",
            "/v1/charges/.;/refunds",
            // backslashes (a separator to IIS and some proxies)
            "/v1/charges\\..\\refunds",
            "/v1/charges/..\\refunds",
            "/v1/charges\\x",
            // empty segments (merged, or read as a host)
            "/v1/charges//../refunds",
            "/v1/charges//x",
            "//v1/charges",
            // bytes outside the plain set
            "/v1/charges/x y",
            "/v1/charges/\u{e9}",
            "/v1/charges/\u{ff0e}\u{ff0e}/refunds",
            "/v1/charges/x\u{0}",
            "/v1/charges/x#y",
            "/v1/charges/x\"y",
            "/v1/charges/x<y",
            "/v1/charges/x|y",
            "/v1/charges/x`y",
            "/v1/charges/x^y",
            "/v1/charges/{x}",
            "/v1/charges/[x]",
        ];
        for path in refused {
            assert!(
                !rule.allows_request(&Method::POST, path),
                "{path:?} must be refused"
            );
        }
        for path in [
            "/v1/charges",
            "/v1/charges/",
            "/v1/charges/ch_1",
            "/v1/charges/a.b/c",
        ] {
            assert!(rule.allows_request(&Method::POST, path), "{path:?}");
        }
        // A rule itself is held to the same spellings.
        for bad in ["/v1/..;/x", "/v1//x", "/v1/...", "/v1;x", "/v1/%2e"] {
            assert!(grant("a.example").with_paths([bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_rules_are_named() {
        let g = grant("a.example");
        assert_eq!(
            g.clone().with_methods(["post"]).unwrap_err(),
            GrantError::Method("post".into())
        );
        assert_eq!(
            g.clone().with_methods(["GE T"]).unwrap_err(),
            GrantError::Method("GE T".into())
        );
        for bad in ["v1", "/a/../b", "/a%2f", "/a\\b"] {
            assert_eq!(
                g.clone().with_paths([bad]).unwrap_err(),
                GrantError::Path(bad.into())
            );
        }
        assert_eq!(
            g.with_addresses(["10.0.0.0/33"]).unwrap_err(),
            GrantError::Address("10.0.0.0/33".into())
        );
    }

    #[test]
    fn non_public_addresses_need_naming() {
        let name = grant("svc.example");
        for (addr, kind) in [
            ("127.0.0.1", "loopback"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("192.168.1.1", "private"),
            ("169.254.169.254", "link-local"),
            ("100.64.0.1", "carrier-grade NAT"),
            ("0.0.0.0", "unspecified"),
            ("::1", "loopback"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:169.254.169.254", "link-local"),
            ("64:ff9b::a9fe:a9fe", "link-local"),
            ("fd00:ec2::254", "private"),
            ("fe80::1", "link-local"),
            ("224.0.0.1", "multicast"),
            ("240.0.0.1", "reserved"),
        ] {
            let ip: IpAddr = addr.parse().unwrap();
            assert!(!name.reaches(ip), "{addr}");
            let found = special_range(ip).unwrap();
            assert!(found.starts_with(kind), "{addr}: {found}");
        }
        for public in ["93.184.216.34", "2606:2800:220:1::1", "8.8.8.8"] {
            assert!(name.reaches(public.parse().unwrap()), "{public}");
        }
        // Named: as the grant's host, or in its addresses.
        assert!(grant("127.0.0.1:8080").reaches("127.0.0.1".parse().unwrap()));
        assert!(!grant("127.0.0.1:8080").reaches("127.0.0.2".parse().unwrap()));
        assert!(grant("[::1]:9").reaches("::1".parse().unwrap()));
        let ranged = name.with_addresses(["10.0.0.0/8", "127.0.0.1"]).unwrap();
        assert!(ranged.reaches("10.9.9.9".parse().unwrap()));
        assert!(ranged.reaches("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!ranged.reaches("127.0.0.2".parse().unwrap()));
        assert!(!ranged.reaches("192.168.0.1".parse().unwrap()));
    }
}
