//! Round trips and refusals of the control protocol's messages.

use super::*;
use datapath::{DirStats, Latency, Stats};

pub(super) fn sample_status() -> Status {
    Status {
        ping: Ping {
            name: "v".into(),
            pid: 42,
            export: ExportKind::Nbd,
            endpoint: "nbd+unix:///?socket=/r/v.nbd.sock".into(),
        },
        volume_type: crate::resolve::VolumeType::Luks2,
        cipher: "aes-xts-plain64".into(),
        keysize_bits: 512,
        device: "/dev/x".into(),
        sector_size: 4096,
        offset_sectors: 32768,
        iv_offset: 0,
        size_sectors: 8192,
        read_only: false,
        suspended: false,
        allow_discards: true,
        flags: Flags {
            perf: PerfFlags {
                no_read_workqueue: true,
                ..PerfFlags::default()
            },
            ..Flags::default()
        },
        mode: CryptMode::Adaptive,
        uptime_s: 3,
        stats: Stats {
            read: DirStats {
                requests: 7,
                latency: Latency {
                    p50_us: 1.5,
                    ..Latency::default()
                },
                ..DirStats::default()
            },
            ..Stats::default()
        },
        nbd: Some(NbdStats {
            connections: 1,
            accepted: 2,
            protocol_errors: 0,
        }),
        vhost: Some(VhostStats {
            connections: 1,
            write_cache: true,
            queues: vec![VhostQueueStats {
                reads: 3,
                ..VhostQueueStats::default()
            }],
        }),
        fuse: Some(FuseStatus {
            transport: "io_uring".into(),
            ring_requests: 7,
        }),
        io: Some(
            backend::IoPath {
                engine: "io_uring".into(),
                direct_align: Some(4096),
                counters: vec![("ring", 5), ("direct", 4), ("buffered", 1)],
            }
            .into(),
        ),
        targets: Vec::new(),
        reencryption: None,
    }
}

#[test]
fn status_and_ping_text() {
    let s = sample_status();
    assert_eq!(
        s.ping.to_string(),
        "v: serving NBD at nbd+unix:///?socket=/r/v.nbd.sock (pid 42)"
    );
    let text = s.to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "v is active and is in use.");
    assert_eq!(lines[1], "  type:    LUKS2");
    assert!(lines.contains(&"  flags:   discards no_read_workqueue"));
    assert!(lines.contains(&"  data path: adaptive"));
    assert!(
        lines.contains(
            &"  io:      io_uring, O_DIRECT (4096-byte alignment); buffered 1, direct 4, ring 5"
        ),
        "{text}"
    );
    assert!(lines.contains(&"  export:  nbd nbd+unix:///?socket=/r/v.nbd.sock"));
    assert!(
        lines.contains(&"  fuse:    transport io_uring, 7 requests over the ring"),
        "{text}"
    );
    assert!(lines[lines.len() - 3].starts_with("  reads:   7 requests, 0 bytes"));
    assert!(lines[lines.len() - 3].ends_with("p50 1.5 us, p99 0.0 us"));
    assert!(!text.ends_with('\n'));
    assert!(!text.contains("skipped:"));
    // cryptsetup's order: size, then skipped (only when set), then mode.
    let mut s = s;
    s.iv_offset = 16;
    let text = s.to_string();
    let lines: Vec<&str> = text.lines().collect();
    let at = lines.iter().position(|l| l.starts_with("  size:")).unwrap();
    assert_eq!(lines[at + 1], "  skipped: 16 sectors");
    assert!(lines[at + 2].starts_with("  mode:"));
    // cryptsetup marks a suspended device on the mode line.
    s.suspended = true;
    let text = s.to_string();
    assert!(
        text.contains("\n  mode:    read/write (suspended)\n"),
        "{text}"
    );
    // --json: the same facts, schema first; an older daemon's status
    // (no `suspended`) still decodes.
    let doc: serde_json::Value = serde_json::from_str(&s.to_json()).unwrap();
    assert_eq!(doc["schema"], JSON_SCHEMA);
    assert_eq!(doc["suspended"], true);
    assert_eq!(doc["size_sectors"], 8192);
    assert_eq!(doc["ping"]["name"], "v");
    let mut old = serde_json::to_value(&s).unwrap();
    old.as_object_mut().unwrap().remove("suspended");
    assert_eq!(doc["io"]["engine"], "io_uring");
    assert_eq!(doc["io"]["direct_align"], 4096);
    assert_eq!(doc["io"]["counters"]["direct"], 4);
    old.as_object_mut().unwrap().remove("io");
    let back: Status = serde_json::from_value(old).unwrap();
    assert!(!back.suspended);
    assert!(back.io.is_none());
}

#[test]
fn requests_round_trip() {
    let all = [
        Request::Ping,
        Request::Status,
        Request::Table { showkeys: true },
        Request::Refresh {
            mode: Some(CryptMode::Inline),
            flags: Flags {
                perf: PerfFlags {
                    same_cpu_crypt: true,
                    ..PerfFlags::default()
                },
                ..Flags::default()
            },
        },
        Request::Refresh {
            mode: None,
            flags: Flags::default(),
        },
        Request::Close,
        Request::Resize {
            size_sectors: Some(4096),
        },
        Request::Resize { size_sectors: None },
        Request::Suspend,
        Request::Resume {
            line: "0 8 crypt aes-xts-plain64 0011 0 /x 0".into(),
        },
        // A multi-line table stays one request line (its newlines escaped).
        Request::Reload {
            table: "0 8 crypt aes-xts-plain64 0011 0 /x 0\n8 8 linear /x 8\n".into(),
        },
    ];
    for req in all {
        let line = encode_request(&req);
        assert!(line.ends_with('\n') && line.matches('\n').count() == 1);
        assert_eq!(decode_request(&line).unwrap(), req, "{line}");
        // The locked-memory encoding is the same line.
        let mut locked = Secret::with_capacity(64);
        encode_request_into(&req, &mut locked);
        assert_eq!(locked.as_str(), Some(line.as_str()));
    }
}

#[test]
fn replies_round_trip() {
    let all = [
        Reply::Ping(sample_status().ping),
        Reply::Status(Box::new(sample_status())),
        Reply::Table {
            line: "0 8 crypt aes-xts-plain64 00 0 /x 0".into(),
        },
        Reply::Refreshed {
            mode: CryptMode::Classic,
            flags: Flags::default(),
            allow_discards: false,
        },
        Reply::Closed,
        Reply::Resized {
            size_sectors: 8,
            notes: vec!["n".into()],
        },
        Reply::Suspended,
        Reply::Resumed,
        Reply::Reloaded {
            targets: 2,
            size_sectors: 16,
        },
        Reply::Failed {
            kind: ErrorKind::Busy,
            message: "Device v is still in use".into(),
        },
    ];
    for reply in all {
        let line = encode_reply(&reply);
        assert_eq!(decode_reply(&line).unwrap(), reply, "{line}");
    }
}

#[test]
fn version_mismatch_is_a_clear_protocol_error() {
    let old = r#"{"version":0,"request":{"cmd":"status"}}"#;
    let e = decode_request(old).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Protocol);
    assert!(e.to_string().contains("version 0"), "{e}");
    assert!(e
        .to_string()
        .contains(&format!("speaks {PROTOCOL_VERSION}")));

    let newer = format!(
        r#"{{"version":{},"reply":{{"reply":"something_new"}}}}"#,
        PROTOCOL_VERSION + 1
    );
    let e = decode_reply(&newer).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Protocol);
    assert!(e.to_string().contains("version mismatch"), "{e}");
}

#[test]
fn garbage_lines_are_errors_not_panics() {
    let lines = [
        "",
        "\n",
        "not json\n",
        "{}\n",
        "[1,2,3]\n",
        r#"{"cmd":"status"}"#,
        r#"{"version":"1","request":{"cmd":"status"}}"#,
        r#"{"version":3}"#,
        r#"{"version":3,"request":{"cmd":"format_disk"}}"#,
        r#"{"version":3,"request":{"cmd":"table"}}"#,
        r#"{"version":3,"request":{"cmd":"refresh","mode":"turbo","flags":{}}}"#,
        "{\"version\":3,\"request\":\u{0}",
    ];
    for l in lines {
        let e = decode_request(l).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{l:?}");
        assert!(e.to_string().starts_with("Malformed control request"));
        let e = decode_reply(l).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Protocol, "{l:?}");
    }
}

#[test]
fn a_daemon_error_keeps_its_kind_across_the_socket() {
    let e = Error::new(ErrorKind::Busy, "Cannot stop")
        .with_source(std::io::Error::other("still mounted"));
    let line = encode_reply(&Reply::from(e));
    match decode_reply(&line).unwrap() {
        Reply::Failed { kind, message } => {
            assert_eq!(kind, ErrorKind::Busy);
            assert_eq!(message, "Cannot stop: still mounted");
        }
        r => panic!("{r:?}"),
    }
}

#[test]
fn a_reencrypt_request_carries_any_passphrase_bytes() {
    let start = ReencryptStart {
        passphrase: Secret::from_slice(&[0, 0xff, b'"', b'\n', 0x80]),
        key_slot: Some(1),
        init: Some(InitParams {
            cipher: Some("aes-xts-plain64".into()),
            ..InitParams::default()
        }),
        init_only: false,
        hotzone: 1 << 20,
        rate: 0,
        resilience: Some("journal".into()),
        resilience_hash: None,
        device_size: Some(8 << 20),
    };
    let req = Request::Reencrypt(Box::new(start));
    let mut line = Secret::with_capacity(256);
    encode_request_into(&req, &mut line);
    let text = line.as_str().unwrap();
    assert!(!text.contains('\u{ff}') && text.ends_with('\n'));
    assert_eq!(decode_request(text).unwrap(), req);
    let bad = text.replace("00ff", "zz");
    assert_eq!(
        decode_request(&bad).unwrap_err().kind(),
        ErrorKind::InvalidInput
    );
}
