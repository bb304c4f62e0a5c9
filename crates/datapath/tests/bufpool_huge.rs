//! With the `ucrypt` binary's allocator (`backend::PageAlignLarge`), a
//! pooled request buffer of 1 MiB lies in a transparent huge page, so it
//! is physically contiguous and a 1 MiB O_DIRECT read into it reaches a
//! virtio disk as one request (254 segments at most per request: 256
//! scattered 4 KiB pages go out as two). Read from /proc/self/smaps (the
//! mapping's AnonHugePages) and, where readable, /proc/self/pagemap (the
//! page frames themselves). Skips when THP is off (`never`).

use ucrypt_datapath::bufpool;

#[global_allocator]
static ALLOC: backend::PageAlignLarge = backend::PageAlignLarge;

const PAGE: usize = 4096;

/// `AnonHugePages` in kB of the mapping holding `addr`.
fn anon_huge_kb(addr: usize) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut inside = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                inside = (a..b).contains(&addr);
                continue;
            }
        }
        if inside {
            if let Some(v) = line.strip_prefix("AnonHugePages:") {
                return v.trim().trim_end_matches("kB").trim().parse().ok();
            }
        }
    }
    None
}

/// The page frame of each page of `len` bytes from `addr` (None: frames
/// hidden, as they are without CAP_SYS_ADMIN).
fn frames(addr: usize, len: usize) -> Option<Vec<u64>> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open("/proc/self/pagemap").ok()?;
    let mut raw = vec![0u8; len / PAGE * 8];
    f.read_exact_at(&mut raw, (addr / PAGE * 8) as u64).ok()?;
    let pfns: Vec<u64> = raw
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()) & ((1 << 55) - 1))
        .collect();
    pfns.iter().all(|&p| p != 0).then_some(pfns)
}

#[test]
fn a_pooled_1m_buffer_is_in_one_huge_page() {
    let mode =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if mode.is_empty() || mode.contains("[never]") {
        eprintln!(
            "skipped: transparent huge pages are off here ({})",
            mode.trim()
        );
        return;
    }
    let len = 1 << 20;
    // Several, as a deep queue takes them: every one must be huge.
    let mut bufs: Vec<Vec<u8>> = (0..4).map(|_| bufpool::take(len)).collect();
    for (i, b) in bufs.iter_mut().enumerate() {
        // What a read does: the device (here the CPU) fills it.
        b.fill(i as u8 + 1);
        let addr = b.as_ptr() as usize;
        let kb = anon_huge_kb(addr).expect("the buffer's mapping in smaps");
        assert!(kb >= 2048, "buffer {i} at {addr:#x}: AnonHugePages {kb} kB");
        assert_eq!(addr % len, 0, "1 MiB-aligned inside its huge page");
        match frames(addr, len) {
            Some(f) => {
                let contiguous = f.windows(2).all(|w| w[1] == w[0] + 1);
                assert!(contiguous, "buffer {i}: page frames not contiguous");
            }
            None => eprintln!("page frames hidden here: smaps only"),
        }
    }
    for b in bufs {
        bufpool::give(b);
    }
}
