//! Every mode × flag set × cipher × backend returns exactly what was
//! written: a randomized workload (overlapping writes, reads, flush,
//! discard, write-zeroes, FUA; up to 16 requests in flight from two
//! submitters) checked against a model, then the whole device read back and
//! its ciphertext compared with `SectorCrypt`'s.

mod common;

use std::sync::Arc;

use common::*;
use ucrypt_datapath::Engine;

const SIZE: u64 = 4 << 20;

fn check_config(idx: usize) {
    let (name, cfg, force) = configs().swap_remove(idx);
    for store in [Store::Mem, Store::File] {
        for c in [NULL, XTS, XTS_4K] {
            let what = format!("{name} / {store:?} / {} {}", c.spec, c.sector_size);
            let b = backing(store, SIZE + DATA_OFFSET);
            let e = Arc::new(
                Engine::new(volume(b.backend.clone(), c, SIZE), cfg.clone()).expect("engine"),
            );
            e.force_split(force);
            let halves = [0..SIZE / 2, SIZE / 2..SIZE];
            let threads: Vec<_> = halves
                .iter()
                .cloned()
                .enumerate()
                .map(|(i, region)| {
                    let (e, what) = (e.clone(), what.clone());
                    std::thread::spawn(move || {
                        let mut m = Model::new(region.clone());
                        let load = Load {
                            ops: 300,
                            qd: 8,
                            max_len: 1 << 20,
                            discards: true,
                        };
                        workload(
                            &what,
                            &e,
                            region.clone(),
                            &mut m,
                            1000 * idx as u64 + i as u64,
                            load,
                        );
                        verify_all(&what, &e, region, &m);
                        m
                    })
                })
                .collect();
            let models: Vec<Model> = threads
                .into_iter()
                .map(|t| t.join().expect("workload thread"))
                .collect();
            e.flush().expect("flush");
            for (region, m) in halves.iter().zip(&models) {
                verify_ciphertext(&what, &*b.backend, c, region.clone(), m);
            }
            let st = e.stats();
            assert!(
                st.read.requests > 0 && st.write.requests > 0,
                "{what}: stats count requests"
            );
            assert_eq!(
                st.read.errors + st.write.errors + st.other_errors,
                0,
                "{what}: no errors"
            );
            assert_eq!(st.in_flight, 0);
            if force {
                assert!(
                    st.read.split + st.write.split > 0,
                    "{what}: split path exercised"
                );
                assert!(
                    st.read.offloaded + st.write.offloaded > 0,
                    "{what}: hand-off path exercised"
                );
            }
            if name == "classic" {
                assert!(
                    st.read.queued > 0 && st.write.queued > 0,
                    "{what}: classic queues requests"
                );
                assert!(
                    st.max_in_flight >= 2,
                    "{what}: requests overlapped in flight"
                );
            }
            if name == "inline" {
                assert_eq!(
                    st.read.queued + st.write.queued,
                    0,
                    "{what}: inline never queues"
                );
            }
            e.shutdown().expect("shutdown");
        }
    }
}

#[test]
fn classic() {
    check_config(0);
}
#[test]
fn classic_same_cpu_crypt() {
    check_config(1);
}
#[test]
fn classic_submit_from_crypt_cpus() {
    check_config(2);
}
#[test]
fn classic_no_read_workqueue() {
    check_config(3);
}
#[test]
fn classic_no_write_workqueue() {
    check_config(4);
}
#[test]
fn inline() {
    check_config(5);
}
#[test]
fn adaptive() {
    check_config(6);
}
#[test]
fn adaptive_forced_split() {
    check_config(7);
}
