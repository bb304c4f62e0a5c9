//! The device as the guest sees it before any request: the virtio feature
//! bits and the virtio-blk configuration space, derived from the engine.
//! Pure: nothing here touches guest memory or the socket.

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_CONFIG_WCE, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH,
    VIRTIO_BLK_F_MQ, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_SIZE_MAX,
    VIRTIO_BLK_F_TOPOLOGY, VIRTIO_BLK_F_WRITE_ZEROES,
};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};

/// Bytes of `struct virtio_blk_config` served (up to and including
/// `write_zeroes_may_unmap` and its padding).
pub const CONFIG_LEN: usize = 60;
/// Offset of the `wce` byte (writeback cache enabled) in the config space.
pub const WCE_OFFSET: usize = 32;
/// Largest single discard / write-zeroes advertised (1 GiB, in 512-byte
/// sectors; the engine takes u32 byte lengths).
pub const MAX_DISCARD_SECTORS: u32 = (1 << 30) >> 9;
/// Largest segment the guest may put in one descriptor (`size_max`).
pub const SIZE_MAX: u32 = 256 << 10;
/// Most data segments per request (`seg_max`): `SEG_MAX * SIZE_MAX` stays
/// under the engine's request limit, so a well-formed request never fails
/// for its size alone.
pub const SEG_MAX: u32 = 126;

/// What the device advertises, from the engine and the options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Device size in bytes (a multiple of the sector size).
    pub size: u64,
    /// The volume's sector size: the logical and physical block size.
    pub sector_size: u32,
    /// Number of request queues.
    pub num_queues: u16,
    /// Discards reach the engine (`--allow-discards`).
    pub discard: bool,
    /// Refuse writes (`--readonly`).
    pub read_only: bool,
}

fn bit(n: u32) -> u64 {
    1u64 << n
}

impl DeviceConfig {
    /// The virtio feature bits offered (the vhost-user protocol-features
    /// bit is added by [`crate::features`]).
    pub fn features(&self) -> u64 {
        let mut f = bit(VIRTIO_F_VERSION_1)
            | bit(VIRTIO_RING_F_EVENT_IDX)
            | bit(VIRTIO_RING_F_INDIRECT_DESC)
            | bit(VIRTIO_BLK_F_SIZE_MAX)
            | bit(VIRTIO_BLK_F_SEG_MAX)
            | bit(VIRTIO_BLK_F_BLK_SIZE)
            | bit(VIRTIO_BLK_F_TOPOLOGY)
            | bit(VIRTIO_BLK_F_FLUSH)
            | bit(VIRTIO_BLK_F_CONFIG_WCE)
            | bit(VIRTIO_BLK_F_MQ);
        if self.read_only {
            f |= bit(VIRTIO_BLK_F_RO);
        } else {
            f |= bit(VIRTIO_BLK_F_WRITE_ZEROES);
            if self.discard {
                f |= bit(VIRTIO_BLK_F_DISCARD);
            }
        }
        f
    }

    /// `struct virtio_blk_config` (little endian) with the given `wce`.
    pub fn space(&self, wce: u8) -> [u8; CONFIG_LEN] {
        let mut c = [0u8; CONFIG_LEN];
        let mut put = |off: usize, bytes: &[u8]| c[off..off + bytes.len()].copy_from_slice(bytes);
        let sector_units = self.sector_size / 512;
        put(0, &(self.size / 512).to_le_bytes()); // capacity
        put(8, &SIZE_MAX.to_le_bytes());
        put(12, &SEG_MAX.to_le_bytes());
        // 16..20 geometry: not offered.
        put(20, &self.sector_size.to_le_bytes()); // blk_size
        put(24, &[sector_units.max(1).trailing_zeros() as u8]); // physical_block_exp
        put(25, &[0]); // alignment_offset
        put(26, &1u16.to_le_bytes()); // min_io_size, in blk_size units
        put(28, &0u32.to_le_bytes()); // opt_io_size
        put(WCE_OFFSET, &[wce]);
        put(34, &self.num_queues.to_le_bytes());
        let discard_max = if self.discard && !self.read_only {
            MAX_DISCARD_SECTORS
        } else {
            0
        };
        put(36, &discard_max.to_le_bytes()); // max_discard_sectors
        put(40, &u32::from(discard_max != 0).to_le_bytes()); // max_discard_seg
        put(44, &sector_units.to_le_bytes()); // discard_sector_alignment
        let zeroes_max = if self.read_only {
            0
        } else {
            MAX_DISCARD_SECTORS
        };
        put(48, &zeroes_max.to_le_bytes()); // max_write_zeroes_sectors
        put(52, &u32::from(zeroes_max != 0).to_le_bytes()); // max_write_zeroes_seg
        put(56, &[0]); // write_zeroes_may_unmap
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(sector_size: u32, discard: bool, read_only: bool) -> DeviceConfig {
        DeviceConfig {
            size: 64 << 20,
            sector_size,
            num_queues: 2,
            discard,
            read_only,
        }
    }

    fn u32_at(c: &[u8], off: usize) -> u32 {
        u32::from_le_bytes(c[off..off + 4].try_into().unwrap())
    }

    #[test]
    fn features_follow_discard_and_read_only() {
        let rw = cfg(512, false, false).features();
        assert_ne!(rw & bit(VIRTIO_BLK_F_WRITE_ZEROES), 0);
        assert_eq!(rw & bit(VIRTIO_BLK_F_DISCARD), 0);
        assert_eq!(rw & bit(VIRTIO_BLK_F_RO), 0);
        assert_ne!(rw & bit(VIRTIO_BLK_F_MQ), 0);
        assert_ne!(rw & bit(VIRTIO_BLK_F_CONFIG_WCE), 0);
        let d = cfg(512, true, false).features();
        assert_ne!(d & bit(VIRTIO_BLK_F_DISCARD), 0);
        let ro = cfg(512, true, true).features();
        assert_ne!(ro & bit(VIRTIO_BLK_F_RO), 0);
        assert_eq!(
            ro & (bit(VIRTIO_BLK_F_DISCARD) | bit(VIRTIO_BLK_F_WRITE_ZEROES)),
            0
        );
    }

    #[test]
    fn config_space_layout() {
        let c = cfg(4096, true, false).space(1);
        assert_eq!(
            u64::from_le_bytes(c[0..8].try_into().unwrap()),
            (64 << 20) / 512
        );
        assert_eq!(u32_at(&c, 8), SIZE_MAX);
        assert_eq!(u32_at(&c, 12), SEG_MAX);
        assert_eq!(u32_at(&c, 20), 4096);
        assert_eq!(c[24], 3, "physical block = 2^3 logical 512-byte sectors");
        assert_eq!(c[WCE_OFFSET], 1);
        assert_eq!(u16::from_le_bytes([c[34], c[35]]), 2);
        assert_eq!(u32_at(&c, 36), MAX_DISCARD_SECTORS);
        assert_eq!(u32_at(&c, 40), 1);
        assert_eq!(u32_at(&c, 44), 8);
        assert_eq!(u32_at(&c, 48), MAX_DISCARD_SECTORS);
        let ro = cfg(512, true, true).space(0);
        assert_eq!(ro[24], 0);
        assert_eq!(ro[WCE_OFFSET], 0);
        assert_eq!(u32_at(&ro, 36), 0);
        assert_eq!(u32_at(&ro, 48), 0);
        // The largest well-formed request fits the engine's limit.
        assert!(u64::from(SEG_MAX) * u64::from(SIZE_MAX) <= datapath::MAX_REQUEST_BYTES);
    }
}
