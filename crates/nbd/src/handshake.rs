//! The option phase: fixed newstyle negotiation (`NBD_OPT_GO`, `INFO`,
//! `LIST`, `ABORT`, `EXPORT_NAME`, `STARTTLS`), ending in the transmission
//! flags the client was given. Under [`TlsMode::Require`] only `STARTTLS`
//! and `ABORT` are answered before TLS is active.

use std::io::{self, Read, Write};
use std::sync::atomic::Ordering;

use crate::proto;
use crate::session::Shared;
use crate::tls::TlsMode;
use crate::Error;

/// The state negotiation ends in.
pub(crate) struct Negotiated {
    /// The transmission flags sent to the client.
    pub(crate) flags: u16,
}

fn write_all(w: &mut impl Write, buf: &[u8]) -> Result<(), Error> {
    w.write_all(buf).map_err(Error::io)
}

/// Reads exactly `buf.len()` bytes; a short read is a protocol violation.
pub(crate) fn read_exact(r: &mut impl Read, buf: &mut [u8], what: &str) -> Result<(), Error> {
    r.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => Error::protocol(format!("Truncated {what}")),
        _ => Error::io(e),
    })
}

/// What the option loop stopped on.
pub(crate) enum Outcome {
    /// `NBD_OPT_GO` / `NBD_OPT_EXPORT_NAME` succeeded: transmission.
    Go(Negotiated),
    /// The client sent `NBD_OPT_ABORT`.
    Abort,
    /// `NBD_OPT_STARTTLS` was acknowledged: the TLS handshake comes next,
    /// then the option loop again ([`Session::tls_active`] set).
    StartTls,
}

/// State carried across the option phase.
pub(crate) struct Session {
    no_zeroes: bool,
    /// The option loop runs inside TLS.
    pub(crate) tls_active: bool,
}

/// The server greeting and the client's flags.
pub(crate) fn greet(r: &mut impl Read, w: &mut impl Write) -> Result<Session, Error> {
    let mut hello = Vec::with_capacity(18);
    hello.extend_from_slice(&proto::NBDMAGIC.to_be_bytes());
    hello.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES).to_be_bytes());
    write_all(w, &hello)?;

    let mut cf = [0u8; 4];
    read_exact(r, &mut cf, "client flags")?;
    let client_flags = u32::from_be_bytes(cf);
    if client_flags & !(proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES) != 0 {
        return Err(Error::protocol(format!(
            "Unknown client flags {client_flags:#x}"
        )));
    }
    Ok(Session {
        no_zeroes: client_flags & proto::FLAG_C_NO_ZEROES != 0,
        tls_active: false,
    })
}

/// The fixed newstyle option loop, until GO/EXPORT_NAME, ABORT or an
/// acknowledged STARTTLS.
pub(crate) fn options(
    r: &mut impl Read,
    w: &mut impl Write,
    shared: &Shared,
    session: &Session,
) -> Result<Outcome, Error> {
    let no_zeroes = session.no_zeroes;
    let flags = transmission_flags(shared);
    let tls_mode = shared.tls.mode();
    let tls_missing = tls_mode == TlsMode::Require && !session.tls_active;

    loop {
        let mut hdr = [0u8; 16];
        read_exact(r, &mut hdr, "option header")?;
        let mut rd = proto::Reader::new(&hdr);
        let (magic, opt, len) = match (rd.u64(), rd.u32(), rd.u32()) {
            (Some(m), Some(o), Some(l)) => (m, o, l),
            _ => return Err(Error::protocol("Short option header")),
        };
        if magic != proto::IHAVEOPT {
            return Err(Error::protocol(format!("Bad option magic {magic:#x}")));
        }
        if len > proto::MAX_OPTION_LEN {
            return Err(Error::protocol(format!(
                "Option {opt} length {len} too large"
            )));
        }
        let mut data = vec![0u8; len as usize];
        read_exact(r, &mut data, "option data")?;
        let stopping = shared.stopping.load(Ordering::SeqCst);
        if tls_missing && opt != proto::OPT_STARTTLS && opt != proto::OPT_ABORT {
            if opt == proto::OPT_EXPORT_NAME {
                // This option cannot carry an error: the spec says close.
                return Err(Error::protocol(
                    "NBD_OPT_EXPORT_NAME before the required TLS",
                ));
            }
            write_all(
                w,
                &proto::option_reply(opt, proto::REP_ERR_TLS_REQD, b"TLS is required"),
            )?;
            continue;
        }
        match opt {
            proto::OPT_EXPORT_NAME => {
                if stopping || !name_matches(&data, shared) {
                    // This option cannot carry an error: the spec says close.
                    return Err(Error::protocol(
                        "Unknown export name in NBD_OPT_EXPORT_NAME",
                    ));
                }
                let mut b = Vec::with_capacity(134);
                b.extend_from_slice(&shared.view.size().to_be_bytes());
                b.extend_from_slice(&flags.to_be_bytes());
                if !no_zeroes {
                    b.extend_from_slice(&[0u8; 124]);
                }
                write_all(w, &b)?;
                return Ok(Outcome::Go(Negotiated { flags }));
            }
            proto::OPT_ABORT => {
                // The client may already have closed; ignore a failed ACK.
                let _ = write_all(w, &proto::option_reply(opt, proto::REP_ACK, &[]));
                return Ok(Outcome::Abort);
            }
            proto::OPT_LIST => {
                if !data.is_empty() {
                    write_all(
                        w,
                        &proto::option_reply(
                            opt,
                            proto::REP_ERR_INVALID,
                            b"NBD_OPT_LIST takes no data",
                        ),
                    )?;
                    continue;
                }
                let name = shared.export.name.as_bytes();
                let mut d = Vec::with_capacity(4 + name.len() + shared.export.description.len());
                d.extend_from_slice(&(name.len() as u32).to_be_bytes());
                d.extend_from_slice(name);
                d.extend_from_slice(shared.export.description.as_bytes());
                write_all(w, &proto::option_reply(opt, proto::REP_SERVER, &d))?;
                write_all(w, &proto::option_reply(opt, proto::REP_ACK, &[]))?;
            }
            proto::OPT_INFO | proto::OPT_GO => {
                let Some(req) = proto::InfoRequest::decode(&data) else {
                    write_all(
                        w,
                        &proto::option_reply(
                            opt,
                            proto::REP_ERR_INVALID,
                            b"Malformed info request",
                        ),
                    )?;
                    continue;
                };
                if stopping {
                    write_all(
                        w,
                        &proto::option_reply(
                            opt,
                            proto::REP_ERR_SHUTDOWN,
                            b"Server is shutting down",
                        ),
                    )?;
                    continue;
                }
                if !name_matches(&req.name, shared) {
                    write_all(
                        w,
                        &proto::option_reply(opt, proto::REP_ERR_UNKNOWN, b"No such export"),
                    )?;
                    continue;
                }
                for item in info_items(&req, flags, shared) {
                    write_all(w, &proto::option_reply(opt, proto::REP_INFO, &item))?;
                }
                write_all(w, &proto::option_reply(opt, proto::REP_ACK, &[]))?;
                if opt == proto::OPT_GO {
                    return Ok(Outcome::Go(Negotiated { flags }));
                }
            }
            proto::OPT_STARTTLS => {
                let (rep, msg): (u32, &[u8]) = if tls_mode == TlsMode::Off {
                    (proto::REP_ERR_POLICY, b"TLS is not enabled on this server")
                } else if session.tls_active {
                    (proto::REP_ERR_INVALID, b"TLS is already active")
                } else if !data.is_empty() {
                    (proto::REP_ERR_INVALID, b"NBD_OPT_STARTTLS takes no data")
                } else {
                    (proto::REP_ACK, b"")
                };
                write_all(w, &proto::option_reply(opt, rep, msg))?;
                if rep == proto::REP_ACK {
                    return Ok(Outcome::StartTls);
                }
            }
            _ => {
                // Structured replies, meta contexts, extended headers, …:
                // not offered; clients fall back to simple replies.
                write_all(w, &proto::option_reply(opt, proto::REP_ERR_UNSUP, &[]))?;
            }
        }
    }
}

fn name_matches(name: &[u8], shared: &Shared) -> bool {
    name.is_empty() || name == shared.export.name.as_bytes()
}

fn transmission_flags(shared: &Shared) -> u16 {
    let mut f = proto::FLAG_HAS_FLAGS
        | proto::FLAG_SEND_FLUSH
        | proto::FLAG_SEND_FUA
        | proto::FLAG_SEND_WRITE_ZEROES
        | proto::FLAG_CAN_MULTI_CONN;
    if shared.view.read_only() {
        f |= proto::FLAG_READ_ONLY;
    }
    if shared.view.allows_discards() {
        f |= proto::FLAG_SEND_TRIM;
    }
    f
}

/// The `NBD_REP_INFO` payloads for a GO/INFO: always export and block size,
/// name and description when asked.
fn info_items(req: &proto::InfoRequest, flags: u16, shared: &Shared) -> Vec<Vec<u8>> {
    let mut items = Vec::new();
    let mut export = Vec::with_capacity(12);
    export.extend_from_slice(&proto::INFO_EXPORT.to_be_bytes());
    export.extend_from_slice(&shared.view.size().to_be_bytes());
    export.extend_from_slice(&flags.to_be_bytes());
    items.push(export);

    let v = &shared.view;
    let mut bs = Vec::with_capacity(14);
    bs.extend_from_slice(&proto::INFO_BLOCK_SIZE.to_be_bytes());
    bs.extend_from_slice(&v.sector_size().to_be_bytes()); // minimum: the volume's sector size
    bs.extend_from_slice(&v.preferred_block_size().to_be_bytes()); // preferred
    bs.extend_from_slice(&proto::MAX_PAYLOAD.to_be_bytes()); // maximum
    items.push(bs);

    if req.requests.contains(&proto::INFO_NAME) {
        let mut n = proto::INFO_NAME.to_be_bytes().to_vec();
        n.extend_from_slice(shared.export.name.as_bytes());
        items.push(n);
    }
    if req.requests.contains(&proto::INFO_DESCRIPTION) {
        let mut d = proto::INFO_DESCRIPTION.to_be_bytes().to_vec();
        d.extend_from_slice(shared.export.description.as_bytes());
        items.push(d);
    }
    items
}
