//! Numbers: unit conversions, the seeds' throughput bound, and aggregation
//! of repetitions (median, spread) and latency samples (percentiles).
//!
//! Conventions (the same as fio's): `MiB/s` = 2^20 bytes per second, `MB/s`
//! = 10^6 bytes per second. Tables print MiB/s; the seeds quote both.

/// Bytes in one MiB (2^20).
pub const MIB: f64 = 1_048_576.0;
/// Bytes in one MB (10^6).
pub const MB: f64 = 1_000_000.0;
/// Bytes in one GiB (2^30).
pub const GIB: f64 = 1_073_741_824.0;

/// Bytes per second to MiB/s.
pub fn mib_per_s(bytes_per_s: f64) -> f64 {
    bytes_per_s / MIB
}

/// Bytes per second to MB/s.
pub fn mb_per_s(bytes_per_s: f64) -> f64 {
    bytes_per_s / MB
}

/// MiB/s to MB/s (fio prints `508MiB/s (533MB/s)`).
pub fn mib_to_mb(mib_s: f64) -> f64 {
    mib_s * MIB / MB
}

/// MB/s to MiB/s.
pub fn mb_to_mib(mb_s: f64) -> f64 {
    mb_s * MB / MIB
}

/// The seeds' theoretical bound for encrypted IO when every byte is both
/// moved (throughput `io`) and en/decrypted (throughput `crypto`) one after
/// the other: time per byte adds up, so `bound = io·c / (io + c)`.
/// Units are whatever the inputs share. Returns 0 when either is 0 or
/// not finite-positive, and `io` when `crypto` is infinite (a no-op cipher).
pub fn bound(io: f64, crypto: f64) -> f64 {
    if io.is_nan() || crypto.is_nan() || io <= 0.0 || crypto <= 0.0 {
        return 0.0;
    }
    if crypto.is_infinite() {
        return io;
    }
    io * crypto / (io + crypto)
}

/// The physical ceiling of encrypted IO when the crypto of different
/// requests runs on `cores` CPUs at once and overlaps the IO:
/// `min(io, cores·c)` (0 for an io or c that is not a positive number).
pub fn ceiling(io: f64, crypto: f64, cores: usize) -> f64 {
    if io.is_nan() || crypto.is_nan() || io <= 0.0 || crypto <= 0.0 {
        return 0.0;
    }
    io.min(crypto * cores.max(1) as f64)
}

/// `part` as a percentage of `whole` (None when `whole` is not positive).
pub fn percent(part: f64, whole: f64) -> Option<f64> {
    (whole > 0.0 && part.is_finite()).then(|| part / whole * 100.0)
}

/// Median of `xs` (mean of the two middle values for an even count);
/// NaN values are ignored; None when nothing is left.
pub fn median(xs: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Median, minimum, maximum and relative spread of repeated measurements.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Summary {
    /// Median of the repetitions.
    pub median: f64,
    /// Smallest repetition.
    pub min: f64,
    /// Largest repetition.
    pub max: f64,
    /// `(max - min) / median` in percent (0 for one repetition).
    pub spread_pct: f64,
}

impl Summary {
    /// Summarises repetitions; None when `xs` has no number.
    pub fn of(xs: &[f64]) -> Option<Self> {
        let median = median(xs)?;
        let finite = xs.iter().copied().filter(|x| !x.is_nan());
        let min = finite.clone().fold(f64::INFINITY, f64::min);
        let max = finite.fold(f64::NEG_INFINITY, f64::max);
        let spread_pct = if median > 0.0 {
            (max - min) / median * 100.0
        } else {
            0.0
        };
        Some(Self {
            median,
            min,
            max,
            spread_pct,
        })
    }
}

/// The `p`-th percentile (0..=100) of **sorted** samples, nearest-rank
/// method as fio reports it: the smallest sample such that at least `p`%
/// of samples are less or equal. None for no samples.
pub fn percentile_sorted(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let p = p.clamp(0.0, 100.0);
    // The epsilon keeps 99.9% of 1000 at rank 999 despite rounding.
    let rank = (p / 100.0 * sorted.len() as f64 - 1e-9).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Latency percentiles of one run, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
}

impl Percentiles {
    /// Sorts `ns` (latencies in nanoseconds) and takes p50/p99/p99.9 in µs.
    pub fn of_ns(ns: &mut [u64]) -> Option<Self> {
        ns.sort_unstable();
        let us = |p| percentile_sorted(ns, p).map(|v| v as f64 / 1000.0);
        Some(Self {
            p50: us(50.0)?,
            p99: us(99.0)?,
            p999: us(99.9)?,
        })
    }

    /// Per-percentile median over repetitions.
    pub fn median_of(reps: &[Self]) -> Option<Self> {
        let pick = |f: fn(&Self) -> f64| median(&reps.iter().map(f).collect::<Vec<_>>());
        Some(Self {
            p50: pick(|p| p.p50)?,
            p99: pick(|p| p.p99)?,
            p999: pick(|p| p.p999)?,
        })
    }
}

/// Parses a byte size: `4096`, `4k`/`4K`/`4KiB`, `1M`, `1G` (powers of
/// 1024, like fio's `bs=`). None on anything else or overflow.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let n: u64 = s[..digits].parse().ok()?;
    let unit = s[digits..].trim().to_ascii_lowercase();
    let mult: u64 = match unit.trim_end_matches("ib").trim_end_matches('b') {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// Parses a duration: `250ms`, `2s`, `1.5s`, or a bare number of
/// milliseconds. None on anything else.
pub fn parse_duration(s: &str) -> Option<std::time::Duration> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else {
        (s, 1e-3)
    };
    let v: f64 = num.trim().parse().ok()?;
    (v.is_finite() && (0.0..1e7).contains(&v))
        .then(|| std::time::Duration::from_secs_f64(v * scale))
}

/// `4k`, `64k`, `1M`.
pub fn fmt_bs(bs: u32) -> String {
    if bs >= 1 << 20 && bs % (1 << 20) == 0 {
        format!("{}M", bs >> 20)
    } else if bs >= 1024 && bs % 1024 == 0 {
        format!("{}k", bs >> 10)
    } else {
        bs.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_matches_the_nas_post() {
        // Seed 002: cryptsetup 1387 MB/s decrypt, ramdisk 2664 MB/s read:
        // 1387*2664/(1387+2664) = 912.11; write 1432*2604/4036 = 923.9
        // ("somewhere around 924 MB/s").
        assert!((bound(2664.0, 1387.0) - 912.11).abs() < 0.01);
        assert!((bound(2604.0, 1432.0) - 923.92).abs() < 0.01);
        assert_eq!(bound(100.0, 100.0), 50.0);
        assert_eq!(bound(300.0, 600.0), 200.0);
        assert_eq!(bound(500.0, f64::INFINITY), 500.0);
        assert_eq!(bound(0.0, 10.0), 0.0);
        assert_eq!(bound(10.0, f64::NAN), 0.0);
        assert_eq!(ceiling(1000.0, 300.0, 2), 600.0);
        assert_eq!(ceiling(500.0, 300.0, 2), 500.0);
        assert_eq!(ceiling(500.0, f64::INFINITY, 1), 500.0);
        assert_eq!(ceiling(500.0, 300.0, 0), 300.0);
        assert_eq!(ceiling(f64::NAN, 300.0, 2), 0.0);
    }

    #[test]
    fn mib_and_mb() {
        // fio: "bw=508MiB/s (533MB/s)".
        assert_eq!(mib_to_mb(508.0).round(), 533.0);
        assert_eq!(mb_to_mib(533.0).round(), 508.0);
        assert_eq!(mib_per_s(1_048_576.0 * 3.0), 3.0);
        assert_eq!(mb_per_s(2_500_000.0), 2.5);
        // dd: 4294967296 bytes in 21.2305 s = 202 MB/s = 192.9 MiB/s.
        let bps = 4_294_967_296.0 / 21.2305;
        assert_eq!(mb_per_s(bps).round(), 202.0);
        assert!((mib_per_s(bps) - 192.93).abs() < 0.01);
        assert_eq!(GIB, 1024.0 * MIB);
    }

    #[test]
    fn sizes_and_durations() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("4k"), Some(4096));
        assert_eq!(parse_size("16KiB"), Some(16384));
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("4MB"), Some(4 << 20));
        assert_eq!(parse_size("2g"), Some(2 << 30));
        assert_eq!(parse_size("k"), None);
        assert_eq!(parse_size("4x"), None);
        assert_eq!(parse_size("-1"), None);
        assert_eq!(parse_size("99999999999999999999k"), None);
        assert_eq!(
            parse_duration("250ms"),
            Some(std::time::Duration::from_millis(250))
        );
        assert_eq!(
            parse_duration("1.5s"),
            Some(std::time::Duration::from_millis(1500))
        );
        assert_eq!(
            parse_duration("40"),
            Some(std::time::Duration::from_millis(40))
        );
        assert_eq!(parse_duration("-1s"), None);
        assert_eq!(parse_duration("fast"), None);
    }

    #[test]
    fn median_and_summary() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, 2.0, 4.0]), Some(3.0));
        let s = Summary::of(&[90.0, 100.0, 120.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (100.0, 90.0, 120.0));
        assert_eq!(s.spread_pct, 30.0);
        assert_eq!(Summary::of(&[7.0]).unwrap().spread_pct, 0.0);
        assert_eq!(percent(50.0, 200.0), Some(25.0));
        assert_eq!(percent(50.0, 0.0), None);
    }

    #[test]
    fn percentiles_nearest_rank() {
        let v: Vec<u64> = (1..=1000).collect();
        assert_eq!(percentile_sorted(&v, 50.0), Some(500));
        assert_eq!(percentile_sorted(&v, 99.0), Some(990));
        assert_eq!(percentile_sorted(&v, 99.9), Some(999));
        assert_eq!(percentile_sorted(&v, 100.0), Some(1000));
        assert_eq!(percentile_sorted(&v, 0.0), Some(1));
        assert_eq!(percentile_sorted(&[], 50.0), None);
        // 10 samples: p50 = 5th, p99 = p99.9 = 10th.
        let mut ns: Vec<u64> = vec![
            10_000, 1_000, 9_000, 2_000, 8_000, 3_000, 7_000, 4_000, 6_000, 5_000,
        ];
        let p = Percentiles::of_ns(&mut ns).unwrap();
        assert_eq!(
            p,
            Percentiles {
                p50: 5.0,
                p99: 10.0,
                p999: 10.0
            }
        );
        let m = Percentiles::median_of(&[
            p,
            Percentiles {
                p50: 1.0,
                p99: 2.0,
                p999: 3.0,
            },
            Percentiles {
                p50: 9.0,
                p99: 9.0,
                p999: 9.0,
            },
        ])
        .unwrap();
        assert_eq!(
            m,
            Percentiles {
                p50: 5.0,
                p99: 9.0,
                p999: 9.0
            }
        );
    }
}
