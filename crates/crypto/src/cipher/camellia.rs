//! Camellia (RFC 3713) with its F function as eight lookups in 64-bit
//! tables: each table holds one S-box's output already spread by the P
//! function, so F is the XOR of eight lookups. Blocks run [`WAYS`] at a
//! time, their rounds interleaved, so the lookups of independent blocks
//! overlap instead of waiting on each other (OpenSSL's and RustCrypto's
//! Camellia convert one block at a time).
//!
//! Hand-written: RustCrypto's `camellia` 0.2 builds the same products with
//! multiplications per byte, one block per call (about 100 MiB/s in XTS
//! here); vendored OpenSSL has Camellia ECB/CBC at ~120-160 MB/s on this
//! machine but no Camellia-XTS. `camellia` 0.2 and OpenSSL stay the
//! references in the tests.

use zeroize::Zeroize;

/// Blocks whose rounds are interleaved.
pub(crate) const WAYS: usize = 4;

/// Camellia with its expanded key, in encryption and decryption order.
pub(crate) struct Camellia {
    enc: Schedule,
    dec: Schedule,
}

/// Subkeys in the order one direction uses them.
struct Schedule {
    /// Whitening: kw[0], kw[1] before the rounds, kw[2], kw[3] after.
    kw: [u64; 4],
    /// Round keys (18 or 24 used).
    k: [u64; 24],
    /// FL/FL^-1 keys between groups of six rounds (4 or 6 used).
    ke: [u64; 6],
    /// Groups of six rounds: 3 for 128-bit keys, 4 otherwise.
    groups: usize,
}

impl Drop for Camellia {
    fn drop(&mut self) {
        for s in [&mut self.enc, &mut self.dec] {
            s.kw.zeroize();
            s.k.zeroize();
            s.ke.zeroize();
        }
    }
}

/// The key-schedule constants Sigma1..Sigma6.
const SIGMA: [u64; 6] = [
    0xa09e_667f_3bcc_908b,
    0xb67a_e858_4caa_73b2,
    0xc6ef_372f_e94f_82be,
    0x54ff_53a5_f1d3_6f1c,
    0x10e5_27fa_de68_2d1d,
    0xb056_88c2_b3e6_c1fd,
];

impl Camellia {
    /// Expands `key` (16, 24 or 32 bytes).
    pub(crate) fn new(key: &[u8]) -> Option<Self> {
        if !matches!(key.len(), 16 | 24 | 32) {
            return None;
        }
        let be = |b: &[u8]| -> u64 {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            u64::from_be_bytes(a)
        };
        let kl = (u128::from(be(&key[..8])) << 64) | u128::from(be(&key[8..16]));
        let kr = match key.len() {
            16 => 0,
            24 => {
                let r = be(&key[16..24]);
                (u128::from(r) << 64) | u128::from(!r)
            }
            _ => (u128::from(be(&key[16..24])) << 64) | u128::from(be(&key[24..32])),
        };
        let two_rounds = |x: u128, s1: u64, s2: u64| -> u128 {
            let (mut d1, mut d2) = ((x >> 64) as u64, x as u64);
            d2 ^= f(d1, s1);
            d1 ^= f(d2, s2);
            (u128::from(d1) << 64) | u128::from(d2)
        };
        let mut ka = two_rounds(kl ^ kr, SIGMA[0], SIGMA[1]);
        ka = two_rounds(ka ^ kl, SIGMA[2], SIGMA[3]);
        let kb = two_rounds(ka ^ kr, SIGMA[4], SIGMA[5]);
        let hi = |x: u128, r: u32| (x.rotate_left(r) >> 64) as u64;
        let lo = |x: u128, r: u32| x.rotate_left(r) as u64;
        let mut enc = Schedule {
            kw: [0; 4],
            k: [0; 24],
            ke: [0; 6],
            groups: 3,
        };
        if key.len() == 16 {
            enc.kw = [hi(kl, 0), lo(kl, 0), hi(ka, 111), lo(ka, 111)];
            let k = [
                hi(ka, 0),
                lo(ka, 0),
                hi(kl, 15),
                lo(kl, 15),
                hi(ka, 15),
                lo(ka, 15),
                hi(kl, 45),
                lo(kl, 45),
                hi(ka, 45),
                lo(kl, 60),
                hi(ka, 60),
                lo(ka, 60),
                hi(kl, 94),
                lo(kl, 94),
                hi(ka, 94),
                lo(ka, 94),
                hi(kl, 111),
                lo(kl, 111),
            ];
            enc.k[..18].copy_from_slice(&k);
            enc.ke[..4].copy_from_slice(&[hi(ka, 30), lo(ka, 30), hi(kl, 77), lo(kl, 77)]);
        } else {
            enc.groups = 4;
            enc.kw = [hi(kl, 0), lo(kl, 0), hi(kb, 111), lo(kb, 111)];
            enc.k = [
                hi(kb, 0),
                lo(kb, 0),
                hi(kr, 15),
                lo(kr, 15),
                hi(ka, 15),
                lo(ka, 15),
                hi(kb, 30),
                lo(kb, 30),
                hi(kl, 45),
                lo(kl, 45),
                hi(ka, 45),
                lo(ka, 45),
                hi(kr, 60),
                lo(kr, 60),
                hi(kb, 60),
                lo(kb, 60),
                hi(kl, 77),
                lo(kl, 77),
                hi(kr, 94),
                lo(kr, 94),
                hi(ka, 94),
                lo(ka, 94),
                hi(kl, 111),
                lo(kl, 111),
            ];
            enc.ke = [
                hi(kr, 30),
                lo(kr, 30),
                hi(kl, 60),
                lo(kl, 60),
                hi(ka, 77),
                lo(ka, 77),
            ];
        }
        // Decryption runs the same network with the subkeys reversed.
        let n = 6 * enc.groups;
        let mut dec = Schedule {
            kw: [enc.kw[2], enc.kw[3], enc.kw[0], enc.kw[1]],
            k: [0; 24],
            ke: [0; 6],
            groups: enc.groups,
        };
        for (d, e) in dec.k[..n].iter_mut().zip(enc.k[..n].iter().rev()) {
            *d = *e;
        }
        let m = 2 * (enc.groups - 1);
        for (d, e) in dec.ke[..m].iter_mut().zip(enc.ke[..m].iter().rev()) {
            *d = *e;
        }
        Some(Self { enc, dec })
    }

    /// Encrypts `blocks` in place.
    pub(crate) fn encrypt_blocks(&self, blocks: &mut [[u8; 16]]) {
        run(&self.enc, blocks);
    }

    /// Decrypts `blocks` in place.
    pub(crate) fn decrypt_blocks(&self, blocks: &mut [[u8; 16]]) {
        run(&self.dec, blocks);
    }
}

fn run(s: &Schedule, blocks: &mut [[u8; 16]]) {
    // The number of round groups as a constant, so the rounds unroll.
    match s.groups {
        3 => run_groups::<3>(s, blocks),
        _ => run_groups::<4>(s, blocks),
    }
}

fn run_groups<const GROUPS: usize>(s: &Schedule, blocks: &mut [[u8; 16]]) {
    let mut chunks = blocks.chunks_exact_mut(WAYS);
    for c in &mut chunks {
        crypt_n::<WAYS, GROUPS>(s, c);
    }
    for b in chunks.into_remainder().chunks_exact_mut(1) {
        crypt_n::<1, GROUPS>(s, b);
    }
}

/// The Feistel network over `N` blocks, `GROUPS` groups of six rounds.
#[inline(always)]
fn crypt_n<const N: usize, const GROUPS: usize>(s: &Schedule, blocks: &mut [[u8; 16]]) {
    let mut d = [[0u64; 2]; N];
    for (d, b) in d.iter_mut().zip(blocks.iter()) {
        let (l, r) = b.split_at(8);
        let mut a = [0u8; 8];
        a.copy_from_slice(l);
        d[0] = u64::from_be_bytes(a) ^ s.kw[0];
        a.copy_from_slice(r);
        d[1] = u64::from_be_bytes(a) ^ s.kw[1];
    }
    for g in 0..GROUPS {
        if g > 0 {
            let (k1, k2) = (s.ke[2 * g - 2], s.ke[2 * g - 1]);
            for d in d.iter_mut() {
                d[0] = fl(d[0], k1);
                d[1] = fl_inv(d[1], k2);
            }
        }
        for r in (6 * g..6 * g + 6).step_by(2) {
            let (k1, k2) = (s.k[r], s.k[r + 1]);
            for d in d.iter_mut() {
                d[1] ^= f(d[0], k1);
            }
            for d in d.iter_mut() {
                d[0] ^= f(d[1], k2);
            }
        }
    }
    for (d, b) in d.iter().zip(blocks.iter_mut()) {
        b[..8].copy_from_slice(&(d[1] ^ s.kw[2]).to_be_bytes());
        b[8..].copy_from_slice(&(d[0] ^ s.kw[3]).to_be_bytes());
    }
}

/// F(x, k): the S-boxes and P over x XOR k, through [`SP`].
#[inline(always)]
fn f(x: u64, k: u64) -> u64 {
    let x = x ^ k;
    SP[0][(x >> 56) as usize]
        ^ SP[1][(x >> 48) as u8 as usize]
        ^ SP[2][(x >> 40) as u8 as usize]
        ^ SP[3][(x >> 32) as u8 as usize]
        ^ SP[4][(x >> 24) as u8 as usize]
        ^ SP[5][(x >> 16) as u8 as usize]
        ^ SP[6][(x >> 8) as u8 as usize]
        ^ SP[7][x as u8 as usize]
}

/// FL: xr ^= (xl & kl) <<< 1; xl ^= xr | kr.
#[inline(always)]
fn fl(x: u64, k: u64) -> u64 {
    let (mut xl, mut xr) = ((x >> 32) as u32, x as u32);
    let (kl, kr) = ((k >> 32) as u32, k as u32);
    xr ^= (xl & kl).rotate_left(1);
    xl ^= xr | kr;
    (u64::from(xl) << 32) | u64::from(xr)
}

/// FL^-1: yl ^= yr | kr; yr ^= (yl & kl) <<< 1.
#[inline(always)]
fn fl_inv(y: u64, k: u64) -> u64 {
    let (mut yl, mut yr) = ((y >> 32) as u32, y as u32);
    let (kl, kr) = ((k >> 32) as u32, k as u32);
    yl ^= yr | kr;
    yr ^= (yl & kl).rotate_left(1);
    (u64::from(yl) << 32) | u64::from(yr)
}

/// For input byte j of F (t1 first): the output bytes of P it reaches
/// (y1 the most significant), as 0x01 bytes of a 64-bit word.
const P_SPREAD: [u64; 8] = {
    // Rows y1..y8 of P, as the input bytes t1..t8 each XORs.
    const ROWS: [[u8; 8]; 8] = [
        [1, 0, 1, 1, 0, 1, 1, 1],
        [1, 1, 0, 1, 1, 0, 1, 1],
        [1, 1, 1, 0, 1, 1, 0, 1],
        [0, 1, 1, 1, 1, 1, 1, 0],
        [1, 1, 0, 0, 0, 1, 1, 1],
        [0, 1, 1, 0, 1, 0, 1, 1],
        [0, 0, 1, 1, 1, 1, 0, 1],
        [1, 0, 0, 1, 1, 1, 1, 0],
    ];
    let mut m = [0u64; 8];
    let mut j = 0;
    while j < 8 {
        let mut i = 0;
        while i < 8 {
            if ROWS[i][j] == 1 {
                m[j] |= 1 << (8 * (7 - i));
            }
            i += 1;
        }
        j += 1;
    }
    m
};

/// S-box and P per input byte of F: `SP[j][v]` is P applied to `s_j(v)` in
/// byte j (s1, s2, s3, s4, s2, s3, s4, s1 for t1..t8).
static SP: [[u64; 256]; 8] = {
    let mut t = [[0u64; 256]; 8];
    let mut v = 0;
    while v < 256 {
        let s1 = SBOX1[v];
        let s2 = s1.rotate_left(1);
        let s3 = s1.rotate_left(7);
        let s4 = SBOX1[(v as u8).rotate_left(1) as usize];
        let s = [s1, s2, s3, s4, s2, s3, s4, s1];
        let mut j = 0;
        while j < 8 {
            t[j][v] = P_SPREAD[j] * s[j] as u64;
            j += 1;
        }
        v += 1;
    }
    t
};

/// SBOX1 of RFC 3713 (the other three derive from it).
const SBOX1: [u8; 256] = [
    0x70, 0x82, 0x2c, 0xec, 0xb3, 0x27, 0xc0, 0xe5, 0xe4, 0x85, 0x57, 0x35, 0xea, 0x0c, 0xae, 0x41,
    0x23, 0xef, 0x6b, 0x93, 0x45, 0x19, 0xa5, 0x21, 0xed, 0x0e, 0x4f, 0x4e, 0x1d, 0x65, 0x92, 0xbd,
    0x86, 0xb8, 0xaf, 0x8f, 0x7c, 0xeb, 0x1f, 0xce, 0x3e, 0x30, 0xdc, 0x5f, 0x5e, 0xc5, 0x0b, 0x1a,
    0xa6, 0xe1, 0x39, 0xca, 0xd5, 0x47, 0x5d, 0x3d, 0xd9, 0x01, 0x5a, 0xd6, 0x51, 0x56, 0x6c, 0x4d,
    0x8b, 0x0d, 0x9a, 0x66, 0xfb, 0xcc, 0xb0, 0x2d, 0x74, 0x12, 0x2b, 0x20, 0xf0, 0xb1, 0x84, 0x99,
    0xdf, 0x4c, 0xcb, 0xc2, 0x34, 0x7e, 0x76, 0x05, 0x6d, 0xb7, 0xa9, 0x31, 0xd1, 0x17, 0x04, 0xd7,
    0x14, 0x58, 0x3a, 0x61, 0xde, 0x1b, 0x11, 0x1c, 0x32, 0x0f, 0x9c, 0x16, 0x53, 0x18, 0xf2, 0x22,
    0xfe, 0x44, 0xcf, 0xb2, 0xc3, 0xb5, 0x7a, 0x91, 0x24, 0x08, 0xe8, 0xa8, 0x60, 0xfc, 0x69, 0x50,
    0xaa, 0xd0, 0xa0, 0x7d, 0xa1, 0x89, 0x62, 0x97, 0x54, 0x5b, 0x1e, 0x95, 0xe0, 0xff, 0x64, 0xd2,
    0x10, 0xc4, 0x00, 0x48, 0xa3, 0xf7, 0x75, 0xdb, 0x8a, 0x03, 0xe6, 0xda, 0x09, 0x3f, 0xdd, 0x94,
    0x87, 0x5c, 0x83, 0x02, 0xcd, 0x4a, 0x90, 0x33, 0x73, 0x67, 0xf6, 0xf3, 0x9d, 0x7f, 0xbf, 0xe2,
    0x52, 0x9b, 0xd8, 0x26, 0xc8, 0x37, 0xc6, 0x3b, 0x81, 0x96, 0x6f, 0x4b, 0x13, 0xbe, 0x63, 0x2e,
    0xe9, 0x79, 0xa7, 0x8c, 0x9f, 0x6e, 0xbc, 0x8e, 0x29, 0xf5, 0xf9, 0xb6, 0x2f, 0xfd, 0xb4, 0x59,
    0x78, 0x98, 0x06, 0x6a, 0xe7, 0x46, 0x71, 0xba, 0xd4, 0x25, 0xab, 0x42, 0x88, 0xa2, 0x8d, 0xfa,
    0x72, 0x07, 0xb9, 0x55, 0xf8, 0xee, 0xac, 0x0a, 0x36, 0x49, 0x2a, 0x68, 0x3c, 0x38, 0xf1, 0xa4,
    0x40, 0x28, 0xd3, 0x7b, 0xbb, 0xc9, 0x43, 0xc1, 0x15, 0xe3, 0xad, 0xf4, 0x77, 0xc7, 0x80, 0x9e,
];
