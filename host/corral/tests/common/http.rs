//! Loopback HTTP servers for outbound-HTTP tests: each records what
//! arrived, so a test can assert what corral sent (or that nothing came).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc::{Receiver, channel};

/// A request's head as it arrived.
#[derive(Debug, Clone, Default)]
pub struct Head {
    /// `POST /v1/charges?x=1 HTTP/1.1`
    pub line: String,
    /// Lower-case names.
    pub headers: Vec<(String, String)>,
}

impl Head {
    pub fn method(&self) -> &str {
        self.line.split(' ').next().unwrap_or("")
    }

    /// The request target (path and query).
    pub fn target(&self) -> &str {
        self.line.split(' ').nth(1).unwrap_or("")
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A loopback server on a port of its own: for each connection, reads the
/// request's head and hands it, with the connection, to `respond` (on a
/// thread of its own). Returns the port.
pub fn loopback_server(
    respond: impl Fn(&Head, &mut BufReader<&TcpStream>, &TcpStream) + Clone + Send + 'static,
) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let respond = respond.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(&stream);
                let mut head = Head::default();
                if reader.read_line(&mut head.line).is_err() {
                    return;
                }
                head.line = head.line.trim_end().to_owned();
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    if let Some((name, value)) = line.trim_end().split_once(':') {
                        head.headers
                            .push((name.to_ascii_lowercase(), value.trim().to_owned()));
                    }
                    line.clear();
                }
                respond(&head, &mut reader, &stream);
            });
        }
    });
    port
}

/// A loopback server that answers every request with what `answer` makes
/// of it (status, extra headers, body) and sends each request (its head
/// and its body) to the returned receiver.
pub fn recording_server(
    answer: impl Fn(&Head) -> (u16, Vec<(String, String)>, String) + Clone + Send + 'static,
) -> (u16, Receiver<(Head, String)>) {
    let (seen, arrived) = channel();
    let port = loopback_server(move |head, reader, mut stream| {
        let length = head
            .header("content-length")
            .and_then(|l| l.parse::<usize>().ok())
            .unwrap_or(0);
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let (status, headers, text) = answer(head);
        let mut response = format!(
            "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n",
            text.len()
        );
        for (name, value) in headers {
            response.push_str(&format!("{name}: {value}\r\n"));
        }
        response.push_str("\r\n");
        response.push_str(&text);
        // Recorded before it is answered: whoever has the answer can count
        // on finding the request among those seen.
        let _ = seen.send((head.clone(), String::from_utf8_lossy(&body).into_owned()));
        let _ = stream.write_all(response.as_bytes());
    });
    (port, arrived)
}

/// Writes a whole response to `stream` (`connection: close`): `status`,
/// `headers` and `body`. Errors are the peer's business.
pub fn respond(stream: &TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]) {
    let mut stream = stream;
    let mut head = format!("HTTP/1.1 {status}\r\ncontent-length: {}\r\n", body.len());
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("connection: close\r\n\r\n");
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body);
}

/// Announces and sends `mib` MiB of spaces as a `content_type` body, until
/// the peer stops reading: a manifest a registry never should send.
pub fn respond_huge(stream: &TcpStream, content_type: &str, mib: usize) {
    let mut stream = stream;
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        mib << 20
    );
    let _ = stream.write_all(head.as_bytes());
    let chunk = vec![b' '; 1 << 20];
    for _ in 0..mib {
        if stream.write_all(&chunk).is_err() {
            return;
        }
    }
}
