//! The choke point and error propagation.
//!
//! Out-of-range, misaligned, oversized and forbidden requests complete with
//! a clean error, never reach the backend, and the engine keeps serving.
//! Backend errors injected with `FaultBackend` complete the affected
//! requests with `Error::Io` — never success — while concurrent requests
//! elsewhere complete correctly.

mod common;

use std::collections::HashMap;
use std::sync::{mpsc, Arc};

use backend::{Backend, FaultBackend, FaultRule, MemBackend, OpKinds};
use common::*;
use ucrypt_datapath::{Engine, EngineConfig, Error, Op, OpKind, Request, MAX_REQUEST_BYTES};

/// Which error a bad request must get.
type IsError = fn(&Error) -> bool;
/// A request in flight: offset, length, whether it touches the bad range,
/// and (reads of good ranges) the bytes it must return.
type Expected = (u64, u64, bool, Option<Vec<u8>>);

const SIZE: u64 = 4 << 20;

fn faulty() -> Arc<FaultBackend<MemBackend>> {
    Arc::new(FaultBackend::new(
        MemBackend::new(SIZE + DATA_OFFSET).expect("mem"),
    ))
}

#[test]
fn bad_requests_fail_cleanly_and_touch_nothing() {
    for (name, cfg, force) in configs() {
        for c in [XTS, XTS_4K] {
            let what = format!("{name} {}", c.sector_size);
            let fb = faulty();
            let cfg = EngineConfig {
                allow_discards: false,
                ..cfg.clone()
            };
            let e = Engine::new(volume(fb.clone(), c, SIZE), cfg.clone()).expect("engine");
            e.force_split(force);
            let ss = c.sector_size as u64;
            let req = |op, offset, fua| Request { op, offset, fua };
            let cases: Vec<(Request, IsError)> = vec![
                (req(Op::Read { len: ss as u32 }, SIZE, false), |e| {
                    matches!(e, Error::OutOfRange { .. })
                }),
                (
                    req(
                        Op::Write {
                            data: vec![1; 2 * ss as usize],
                        },
                        SIZE - ss,
                        false,
                    ),
                    |e| matches!(e, Error::OutOfRange { .. }),
                ),
                (req(Op::Read { len: 512 }, u64::MAX - 511, false), |e| {
                    matches!(e, Error::OutOfRange { .. }) || matches!(e, Error::Misaligned { .. })
                }),
                (req(Op::WriteZeroes { len: ss as u32 }, SIZE, false), |e| {
                    matches!(e, Error::OutOfRange { .. })
                }),
                (req(Op::Read { len: ss as u32 }, 100, false), |e| {
                    matches!(e, Error::Misaligned { .. })
                }),
                (req(Op::Write { data: vec![1; 100] }, 0, false), |e| {
                    matches!(e, Error::Misaligned { .. })
                }),
                (
                    req(
                        Op::Write {
                            data: vec![1; ss as usize + 512],
                        },
                        0,
                        false,
                    ),
                    |e| {
                        // 512-byte sectors accept this length; 4K ones must not.
                        matches!(e, Error::Misaligned { .. })
                    },
                ),
                (
                    req(
                        Op::Read {
                            len: (MAX_REQUEST_BYTES + ss) as u32,
                        },
                        0,
                        false,
                    ),
                    |e| {
                        matches!(
                            e,
                            Error::TooLarge {
                                op: OpKind::Read,
                                ..
                            }
                        )
                    },
                ),
                (
                    req(
                        Op::Write {
                            data: vec![1; (MAX_REQUEST_BYTES + ss) as usize],
                        },
                        0,
                        false,
                    ),
                    |e| {
                        matches!(
                            e,
                            Error::TooLarge {
                                op: OpKind::Write,
                                ..
                            }
                        )
                    },
                ),
                (req(Op::Discard { len: ss as u32 }, 0, false), |e| {
                    matches!(e, Error::DiscardDisabled)
                }),
                (req(Op::Read { len: ss as u32 }, 0, true), |e| {
                    matches!(e, Error::FuaOnRead)
                }),
            ];
            for (i, (r, ok)) in cases.into_iter().enumerate() {
                if i == 6 && ss == 512 {
                    continue;
                }
                match run(&e, r) {
                    Err(err) => {
                        assert!(ok(&err), "{what}: case {i}: unexpected error kind {err:?}");
                        assert!(err
                            .to_string()
                            .chars()
                            .next()
                            .is_some_and(|c| c.is_uppercase()));
                    }
                    Ok(_) => panic!("{what}: case {i} succeeded"),
                }
            }
            let counts = fb.counts();
            assert_eq!(
                (
                    counts.reads,
                    counts.writes,
                    counts.discards,
                    counts.write_zeroes
                ),
                (0, 0, 0, 0),
                "{what}: rejected requests reached the backend"
            );
            // Still serving.
            e.write(ss, vec![0xab; 2 * ss as usize], false)
                .expect("valid write after errors");
            assert_eq!(
                e.read(ss, 2 * ss as u32).expect("read"),
                vec![0xab; 2 * ss as usize],
                "{what}"
            );
            let st = e.stats();
            assert!(
                st.read.errors >= 4 && st.write.errors >= 3,
                "{what}: errors counted: {st:?}"
            );
            // Read-only refuses every kind of write.
            e.reconfigure(EngineConfig {
                read_only: true,
                allow_discards: true,
                ..cfg.clone()
            })
            .expect("reconfigure");
            let before = fb.counts();
            assert!(matches!(
                e.write(0, vec![0; ss as usize], true),
                Err(Error::ReadOnly { op: OpKind::Write })
            ));
            assert!(matches!(
                e.write_zeroes(0, ss as u32, false),
                Err(Error::ReadOnly {
                    op: OpKind::WriteZeroes
                })
            ));
            assert!(matches!(
                e.discard(0, ss as u32),
                Err(Error::ReadOnly {
                    op: OpKind::Discard
                })
            ));
            let after = fb.counts();
            assert_eq!(
                (before.writes, before.write_zeroes, before.discards),
                (after.writes, after.write_zeroes, after.discards)
            );
            assert_eq!(
                e.read(ss, ss as u32).expect("read-only read"),
                vec![0xab; ss as usize]
            );
            e.shutdown().expect("shutdown");
            assert!(
                matches!(e.read(0, ss as u32), Err(Error::Shutdown)),
                "{what}: shut down"
            );
        }
    }
}

#[test]
fn engine_validates_volume_and_config() {
    let mem: Arc<dyn Backend> = Arc::new(MemBackend::new(1 << 20).expect("mem"));
    let bad_size = volume(mem.clone(), XTS, 1 << 20); // does not fit after DATA_OFFSET
    assert!(matches!(
        Engine::new(bad_size, EngineConfig::default()),
        Err(Error::Invalid(_))
    ));
    let mut v = volume(mem.clone(), XTS_4K, 512 << 10);
    v.sector_size = 512; // cipher says 4096
    assert!(matches!(
        Engine::new(v, EngineConfig::default()),
        Err(Error::Invalid(_))
    ));
    let e =
        Engine::new(volume(mem.clone(), XTS, 512 << 10), EngineConfig::default()).expect("engine");
    assert!(matches!(
        e.reconfigure(EngineConfig {
            queue_depth: 0,
            ..EngineConfig::default()
        }),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        e.reload(volume(mem, XTS, 2 << 20)),
        Err(Error::Invalid(_))
    ));
    e.write(0, vec![9; 4096], false)
        .expect("still serving after refused swaps");
}

#[test]
fn backend_errors_propagate_and_spare_other_requests() {
    for (name, cfg, force) in configs() {
        let fb = faulty();
        let e = Engine::new(volume(fb.clone(), XTS, SIZE), cfg.clone()).expect("engine");
        e.force_split(force);
        // Known content everywhere first.
        let mut rng = Rng::new(5);
        let mut m = Model::new(0..SIZE);
        for off in (0..SIZE).step_by(1 << 20) {
            let mut d = vec![0; 1 << 20];
            rng.fill(&mut d);
            e.write(off, d.clone(), false).expect("prefill");
            m.write(off, &d);
        }
        let bad = (1 << 20)..(1 << 20) + (64 << 10); // device offsets
        let rule = FaultRule::error(OpKinds::READ | OpKinds::WRITE, libc_eio())
            .range(DATA_OFFSET + bad.start..DATA_OFFSET + bad.end);
        let id = fb.add_rule(rule);
        let (tx, rx) = mpsc::channel();
        let mut expect: HashMap<u64, Expected> = HashMap::new();
        for i in 0..200u64 {
            // Writes stay inside the bad range (a failed write may leave
            // any part of its range changed, as on a disk); reads go
            // anywhere.
            let write = i % 4 == 0;
            let (off, len) = if write {
                let off = bad.start + 4096 * rng.below(15);
                (off, 4096 * (1 + rng.below((bad.end - off) / 4096)))
            } else {
                let len = 4096 * (1 + rng.below(64));
                (4096 * rng.below((SIZE - len) / 4096 + 1), len)
            };
            let hits = off < bad.end && bad.start < off + len;
            let op = if write {
                Op::Write {
                    data: vec![7; len as usize],
                }
            } else {
                Op::Read { len: len as u32 }
            };
            let exp = if write {
                None
            } else {
                Some(m.data[off as usize..(off + len) as usize].to_vec())
            };
            expect.insert(i, (off, len, hits, exp));
            let tx = tx.clone();
            e.submit(
                Request {
                    op,
                    offset: off,
                    fua: false,
                },
                move |c| {
                    let _ = tx.send((i, c));
                },
            );
        }
        for _ in 0..200 {
            let (i, c) = rx.recv_timeout(HANG).expect("completion");
            let (off, len, hits, exp) = expect.remove(&i).expect("known id");
            match (hits, c) {
                (true, Err(Error::Io(_))) => {}
                (true, other) => {
                    panic!("{name}: request at {off}+{len} over the bad range returned {other:?}")
                }
                (false, Ok(data)) => {
                    if let Some(exp) = exp {
                        assert!(
                            data.as_deref() == Some(&exp[..]),
                            "{name}: good read at {off} corrupted"
                        );
                    }
                }
                (false, Err(err)) => panic!("{name}: good request at {off} failed: {err}"),
            }
        }
        assert!(fb.fired(id).unwrap_or(0) > 0);
        fb.clear_rules();
        // Flush errors surface too.
        fb.add_rule(FaultRule::error(OpKinds::FLUSH, libc_eio()).once());
        assert!(
            matches!(e.flush(), Err(Error::Io(_))),
            "{name}: flush error propagates"
        );
        e.flush().expect("flush after a one-shot fault");
        // Everything outside the failed writes is intact.
        for s in (bad.start / 512)..(bad.end / 512) {
            m.defined[s as usize] = false;
        }
        verify_all(name, &e, 0..SIZE, &m);
        e.shutdown().expect("shutdown");
    }
}

fn libc_eio() -> i32 {
    5
}
