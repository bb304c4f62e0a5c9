//! The daemon's side of the control socket: one request line in, one
//! reply line out, per connection, for our own uid and root only.

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::time::Duration;

use crypto::Secret;

use super::client::peer_uid;
use super::{decode_request, encode_reply_into, read_line, Reply, Request};
use crate::error::{Error, ErrorKind};
use crate::runtime;

/// Longest request line the daemon reads.
const MAX_REQUEST: u64 = 64 << 10;

/// What the daemon's handler made of one request.
pub struct Handled {
    /// The reply to send.
    pub reply: Reply,
    /// Runs once the reply has been written (or failed to be).
    pub after_reply: Option<Box<dyn FnOnce() + Send>>,
    /// Stop answering further requests (the daemon is going away).
    pub last: bool,
}

impl From<Reply> for Handled {
    fn from(reply: Reply) -> Self {
        Self {
            reply,
            after_reply: None,
            last: false,
        }
    }
}

/// The daemon's side: answers connections on `listener` one at a time
/// until the listener fails or a handled request is `last`. A peer of
/// another uid than ours or root (`SO_PEERCRED`), a malformed line or a
/// version mismatch is answered with [`Reply::Failed`] without reaching
/// `handle`.
pub fn serve(listener: UnixListener, mut handle: impl FnMut(Request) -> Handled) {
    let me = runtime::euid();
    serve_for(listener, &|uid| allowed(uid, me), &mut handle)
}

/// Whether a peer of uid `peer` may talk to a daemon running as `me`.
fn allowed(peer: u32, me: u32) -> bool {
    peer == me || peer == 0
}

/// [`serve`], serving the peers whose uid `may` allows.
fn serve_for(
    listener: UnixListener,
    may: &dyn Fn(u32) -> bool,
    handle: &mut impl FnMut(Request) -> Handled,
) {
    let mut closing = false;
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        if closing {
            continue;
        }
        // One short request per connection; a stuck client cannot block
        // others for long.
        let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
        match peer_uid(&conn) {
            Ok(uid) if may(uid) => {}
            // Not a byte of the request is read, nothing reaches `handle`.
            who => {
                let who = who.map_or("an unknown uid".to_owned(), |u| format!("uid {u}"));
                let e = Error::new(
                    ErrorKind::PermissionDenied,
                    format!("Permission denied: this daemon does not serve {who}"),
                );
                let mut text = Secret::with_capacity(256);
                encode_reply_into(&Reply::from(e), &mut text);
                let _ = (&conn).write_all(&text);
                continue;
            }
        }
        let Ok(reader) = conn.try_clone() else {
            continue;
        };
        // Read into locked memory: `resume` carries a key.
        let Ok(line) = read_line(reader.take(MAX_REQUEST)) else {
            continue;
        };
        let handled = match decode_request(line.as_str().unwrap_or("")) {
            Ok(req) => handle(req),
            Err(e) => Reply::from(e).into(),
        };
        closing = handled.last;
        // `table --showkeys` carries the key: the line is encoded into
        // locked memory and written from there; both wipe as they drop.
        let mut text = Secret::with_capacity(4096);
        encode_reply_into(&handled.reply, &mut text);
        let _ = (&conn).write_all(&text);
        drop(text);
        drop(line);
        drop(handled.reply);
        if let Some(f) = handled.after_reply {
            f();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader};
    use std::os::unix::net::UnixStream;

    use super::super::{decode_reply, encode_request};
    use super::*;
    use crate::error::{Error, ErrorKind};

    #[test]
    fn only_our_uid_and_root_are_served() {
        assert!(allowed(1000, 1000) && allowed(0, 1000) && allowed(0, 0));
        assert!(!allowed(1001, 1000) && !allowed(1000, 0));
        // A loop serving only another uid refuses us before reading.
        let dir = testutil::TempDir::new("daemon-ctl-peer");
        let sock = dir.join("p.ctl.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let me = runtime::euid();
        std::thread::spawn(move || {
            serve_for(listener, &|uid| uid != me, &mut |_| -> Handled {
                panic!("a refused peer's request reached the handler")
            })
        });
        // Refused before the request is read: the answer comes without one.
        let s = UnixStream::connect(&sock).unwrap();
        let mut reply = String::new();
        BufReader::new(s).read_line(&mut reply).unwrap();
        match decode_reply(&reply).unwrap() {
            Reply::Failed { kind, message } => {
                assert_eq!(kind, ErrorKind::PermissionDenied);
                assert!(message.contains(&format!("uid {me}")), "{message}");
            }
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn server_loop_answers_typed_and_refuses_garbage() {
        let dir = testutil::TempDir::new("daemon-ctl");
        let sock = dir.join("t.ctl.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let server = std::thread::spawn(move || {
            serve(listener, |req| match req {
                Request::Table { showkeys } => Reply::Table {
                    line: Secret::from(format!("shown={showkeys}").as_str()),
                }
                .into(),
                Request::Close => Handled {
                    reply: Reply::Closed,
                    after_reply: None,
                    last: true,
                },
                _ => Reply::from(Error::new(ErrorKind::InvalidInput, "No")).into(),
            })
        });
        let exchange = |text: &str| {
            let mut s = UnixStream::connect(&sock).unwrap();
            s.write_all(text.as_bytes()).unwrap();
            let mut reply = String::new();
            BufReader::new(s).read_line(&mut reply).unwrap();
            decode_reply(&reply).unwrap()
        };
        assert_eq!(
            exchange(&encode_request(&Request::Table { showkeys: true })),
            Reply::Table {
                line: Secret::from("shown=true")
            }
        );
        match exchange("garbage\n") {
            Reply::Failed { kind, .. } => assert_eq!(kind, ErrorKind::InvalidInput),
            r => panic!("{r:?}"),
        }
        match exchange("{\"version\":99,\"request\":{\"cmd\":\"ping\"}}\n") {
            Reply::Failed { kind, message } => {
                assert_eq!(kind, ErrorKind::Protocol);
                assert!(message.contains("version 99"), "{message}");
            }
            r => panic!("{r:?}"),
        }
        assert_eq!(exchange(&encode_request(&Request::Close)), Reply::Closed);
        // The loop ignores connections after `last` and never returns:
        // the test ends with its thread detached.
        drop(server);
    }
}
