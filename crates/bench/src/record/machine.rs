//! The machine the numbers come from, read from /proc.

use crate::stats;

/// The machine the numbers come from.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Machine {
    /// CPU model (from /proc/cpuinfo).
    pub cpu_model: String,
    /// Online CPUs.
    pub cpus: usize,
    /// Total memory in bytes.
    pub mem_total_bytes: u64,
    /// Kernel release.
    pub kernel: String,
    /// CPU flags that matter for AES (`aes`, `vaes`, `avx2`, `avx512f`).
    pub cpu_flags: Vec<String>,
}

impl Machine {
    /// Reads /proc.
    pub fn detect() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |name: &str| {
            cpuinfo
                .lines()
                .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        };
        let flags = field("flags").unwrap_or_default();
        let cpu_flags = ["aes", "vaes", "avx2", "avx512f"]
            .iter()
            .filter(|f| flags.split_whitespace().any(|x| x == **f))
            .map(|f| f.to_string())
            .collect();
        let mem_total_bytes = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .map(str::to_string)
            })
            .and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
            })
            .map_or(0, |kb| kb * 1024);
        Self {
            cpu_model: field("model name").unwrap_or_else(|| "unknown".into()),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            mem_total_bytes,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map_or_else(|_| "unknown".into(), |s| s.trim().to_string()),
            cpu_flags,
        }
    }

    /// One line: `AMD EPYC, 2 CPUs (aes avx2), 23.5 GiB, Linux 6.18`.
    pub fn describe(&self) -> String {
        format!(
            "{}, {} CPUs ({}), {:.1} GiB RAM, Linux {}",
            self.cpu_model,
            self.cpus,
            if self.cpu_flags.is_empty() {
                "no AES-NI".into()
            } else {
                self.cpu_flags.join(" ")
            },
            self.mem_total_bytes as f64 / stats::GIB,
            self.kernel
        )
    }
}
