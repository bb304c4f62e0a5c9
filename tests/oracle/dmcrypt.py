#!/usr/bin/env python3
"""Independent dm-crypt sector oracle (python3 + `cryptography`).

Computes what Linux dm-crypt would write to (encrypt) or read from (decrypt)
the underlying device, sector by sector, written from
Documentation/admin-guide/device-mapper/dm-crypt.rst and the IV rules of
drivers/md/dm-crypt.c, without sharing any code with ucrypt (Rust).

Usage:
    python3 tests/oracle/dmcrypt.py {encrypt|decrypt} --cipher SPEC --key HEX \
        [--sector-size N] [--iv-offset SECTORS] [--iv-large-sectors] \
        [--start-sector S] < in > out

  SPEC            legacy `cipher[:keycount]-chain-ivmode[:ivopts]` (aes-xts-plain64,
                  aes:2-cbc-essiv:sha256, aes-ecb, cipher_null-ecb, aes-lrw-benbi,
                  cast5-cbc-tcw) or capi form
                  (capi:xts(aes)-plain64, capi:ecb(cipher_null), capi:cbc(aes)-essiv:sha256)
  HEX             the key in hex; `-` for cipher_null
  --sector-size   encryption sector size, 512..4096 (default 512)
  --iv-offset     table <iv_offset>, in 512-byte sectors (default 0)
  --iv-large-sectors  IVs count sector_size units instead of 512-byte ones
  --start-sector  512-byte sector (relative to the mapping start) of the first
                  input byte (default 0)

Batch mode (one process for many conversions, used by the Rust tests):
    python3 tests/oracle/dmcrypt.py batch < jobs.jsonl > results.jsonl
  each input line {"direction", "cipher", "key", "sector_size", "iv_offset",
  "iv_large_sectors", "start_sector", "data": HEX} gives one output line
  {"data": HEX} or {"error": MESSAGE}.

Input length must be a multiple of the sector size. Supported: AES-128/192/256
in xts/cbc/ecb, cipher_null-ecb, IV modes plain, plain64, plain64be,
essiv:<hash>, benbi, null, eboiv. XTS keys with equal halves and AES-192-XTS
(which OpenSSL, and so `cryptography`, refuses) go through an XTS built on
AES-ECB here.

TrueCrypt's legacy modes, as dm-crypt maps them (cryptsetup's tcrypt code):
  lrw-benbi  the kernel's `lrw` template (crypto/lrw.c): the key is the cipher
             key then a 16-byte tweak key K2; block j of a sector is
             E(P xor T) xor T with T = K2 * (I + j) in GF(2^128) (big-endian
             bits, x^128 + x^7 + x^2 + x + 1), I the benbi IV as a big-endian
             128-bit number (the sector's 1-based first block index). Built
             here on ECB, since `cryptography` has no LRW.
  cbc-tcw    dm-crypt's `tcw` IV (crypt_iv_tcw_*): the key is the cipher key,
             an IV seed (one cipher block) and 16 bytes of whitening. IV =
             seed xor the little-endian sector number (repeated over a
             16-byte block); the ciphertext of a 512-byte sector is then
             xored with 8 bytes of whitening: whitening xor the sector number
             (both halves), each 4-byte word replaced by its CRC-32 as the
             kernel's `crc32` shash gives it (seed ~0, no final inversion,
             little-endian), then words 0 ^ 3 and 1 ^ 2.
Ciphers beside AES for these and plain CBC/ECB (plain, plain64, plain64be,
null, benbi, tcw IVs): cast5 and des3_ede (64-bit blocks) and camellia, from
`cryptography` (its `decrepit` module where the version has one).
Exit status 2 with a message on stderr for anything it cannot compute.
"""

import argparse
import hashlib
import json
import sys
import zlib

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

try:  # cryptography 43+ keeps the old ciphers here
    from cryptography.hazmat.decrepit.ciphers import algorithms as old_algorithms
except ImportError:  # older versions (Debian 12: 38) have them in `algorithms`
    old_algorithms = algorithms


class OracleError(Exception):
    """Something the oracle cannot compute (bad spec, key or length)."""


def fail(msg):
    raise OracleError(msg)


def parse_spec(spec):
    """Returns (cipher, keycount, chain, ivmode, ivopts)."""
    if spec.startswith("capi:"):
        rest = spec[5:]
        ivopts = None
        if ":" in rest:
            rest, ivopts = rest.rsplit(":", 1)
        ivmode = None
        if "-" in rest:
            rest, ivmode = rest.rsplit("-", 1)
        if not rest.endswith(")") or "(" not in rest:
            fail("bad capi spec " + spec)
        chain, cipher = rest[:-1].split("(", 1)
        return cipher, 1, chain, ivmode, ivopts
    parts = spec.split("-", 2)
    head = parts[0]
    keycount = 1
    if ":" in head:
        head, kc = head.split(":", 1)
        keycount = int(kc)
    chain = parts[1] if len(parts) > 1 else None
    ivmode, ivopts = None, None
    if len(parts) > 2:
        ivmode = parts[2]
        if ":" in ivmode:
            ivmode, ivopts = ivmode.split(":", 1)
    if chain is None or (chain == "plain" and ivmode is None):
        chain, ivmode = "cbc", "plain"
    return head, keycount, chain, ivmode, ivopts


def algorithm(cipher, key):
    """The `cryptography` block cipher for a dm-crypt cipher name."""
    if cipher == "aes":
        return algorithms.AES(key)
    if cipher == "camellia":
        return old_algorithms.Camellia(key)
    if cipher == "cast5":
        return old_algorithms.CAST5(key)
    if cipher == "des3_ede":
        if len(key) != 24:
            fail("des3_ede takes a 24-byte key")
        return old_algorithms.TripleDES(key)
    fail("unsupported cipher " + cipher)


def block_size(cipher):
    return 8 if cipher in ("cast5", "des3_ede") else 16


def ecb(cipher, key, data, encrypt=True):
    c = Cipher(algorithm(cipher, key), modes.ECB())
    op = c.encryptor() if encrypt else c.decryptor()
    return op.update(data) + op.finalize()


def aes_ecb(key, data, encrypt=True):
    return ecb("aes", key, data, encrypt)


def gf128_mul(a, b):
    """Product in GF(2^128), bit i of the big-endian number = coefficient of x^i."""
    r = 0
    while b:
        if b & 1:
            r ^= a
        b >>= 1
        a <<= 1
        if a >> 128:
            a ^= (1 << 128) | 0x87
    return r


def lrw(cipher, key, iv, data, encrypt):
    """The kernel's lrw(cipher) over whole 16-byte blocks."""
    if block_size(cipher) != 16:
        fail("lrw needs a 16-byte block cipher")
    if len(key) <= 16:
        fail("lrw key too short")
    k1, k2 = key[:-16], int.from_bytes(key[-16:], "big")
    index = int.from_bytes(iv, "big")
    tweaks = b"".join(
        gf128_mul(k2, (index + j) % (1 << 128)).to_bytes(16, "big")
        for j in range(len(data) // 16)
    )
    x = bytes(a ^ b for a, b in zip(data, tweaks))
    y = ecb(cipher, k1, x, encrypt)
    return bytes(a ^ b for a, b in zip(y, tweaks))


def kernel_crc32(data):
    """The kernel's `crc32` shash: CRC-32 (IEEE) seeded with ~0, not inverted."""
    return (zlib.crc32(data) ^ 0xFFFFFFFF).to_bytes(4, "little")


def tcw_whitening(whitening, sector):
    """The 8 bytes dm-crypt's tcw xors over each 8 bytes of a sector."""
    s = sector.to_bytes(8, "little")
    buf = bytes(a ^ b for a, b in zip(whitening, s + s))
    buf = b"".join(kernel_crc32(buf[i:i + 4]) for i in range(0, 16, 4))
    return bytes(buf[i] ^ buf[12 + i] for i in range(4)) + bytes(
        buf[4 + i] ^ buf[8 + i] for i in range(4))


def xts_by_ecb(key, tweak_iv, data, encrypt):
    """IEEE 1619 XTS for whole blocks, from AES-ECB (any key, equal halves too)."""
    half = len(key) // 2
    k1, k2 = key[:half], key[half:]
    t = int.from_bytes(aes_ecb(k2, tweak_iv), "little")
    out = bytearray()
    for off in range(0, len(data), 16):
        tb = t.to_bytes(16, "little")
        x = bytes(a ^ b for a, b in zip(data[off:off + 16], tb))
        y = aes_ecb(k1, x, encrypt)
        out += bytes(a ^ b for a, b in zip(y, tb))
        carry = t >> 127
        t = ((t << 1) & ((1 << 128) - 1)) ^ (0x87 if carry else 0)
    return bytes(out)


def chain_crypt(chain, key, iv, data, encrypt, cipher="aes"):
    if chain == "lrw":
        return lrw(cipher, key, iv, data, encrypt)
    if cipher != "aes":
        if chain == "cbc":
            mode = modes.CBC(iv)
        elif chain == "ecb":
            mode = modes.ECB()
        else:
            fail("%s supports cbc, ecb and lrw here, not %s" % (cipher, chain))
        c = Cipher(algorithm(cipher, key), mode)
        op = c.encryptor() if encrypt else c.decryptor()
        return op.update(data) + op.finalize()
    if chain == "xts":
        half = len(key) // 2
        # OpenSSL (behind `cryptography`) refuses equal halves and has no
        # AES-192-XTS; dm-crypt accepts both.
        if key[:half] == key[half:] or len(key) == 48:
            return xts_by_ecb(key, iv, data, encrypt)
        mode = modes.XTS(iv)
    elif chain == "cbc":
        mode = modes.CBC(iv)
    elif chain == "ecb":
        mode = modes.ECB()
    else:
        fail("unsupported chain mode " + chain)
    c = Cipher(algorithms.AES(key), mode)
    op = c.encryptor() if encrypt else c.decryptor()
    return op.update(data) + op.finalize()


def convert(direction, spec, key, ss=512, iv_offset=0, large=False, start=0, data=b""):
    """Encrypts or decrypts `data` as dm-crypt would; returns the bytes."""
    cipher, keycount, chain, ivmode, ivopts = parse_spec(spec)
    if ss < 512 or ss > 4096 or ss & (ss - 1):
        fail("bad sector size")
    step = ss // 512
    shift = step.bit_length() - 1
    if len(data) % ss:
        fail("input is not a multiple of the sector size")
    encrypt = direction == "encrypt"

    if cipher == "cipher_null":
        if chain != "ecb" or key:
            fail("cipher_null needs ecb and key -")
        return bytes(data)
    if cipher not in ("aes", "camellia", "cast5", "des3_ede"):
        fail("unsupported cipher " + cipher)
    if cipher != "aes" and ivmode in ("essiv", "eboiv"):
        fail("IV mode %s is AES-only here" % ivmode)
    bs = block_size(cipher)
    if keycount < 1 or len(key) % keycount:
        fail("key does not split into keycount parts")
    tcw = None
    if ivmode == "tcw":
        # The cipher key, then the IV seed and the whitening.
        if chain != "cbc" or keycount != 1 or ss != 512:
            fail("tcw needs cbc, one key and 512-byte sectors")
        if len(key) <= bs + 16:
            fail("tcw key too short")
        tcw = (key[-(bs + 16):-16], key[-16:])
        key = key[:-(bs + 16)]
    sub = len(key) // keycount
    subkeys = [key[i * sub:(i + 1) * sub] for i in range(keycount)]
    has_iv = chain != "ecb"
    if has_iv and ivmode is None:
        fail("IV mechanism required")

    def iv_for(cc_sector, k):
        s = (cc_sector >> shift) if large else cc_sector
        m = 1 << 64
        if ivmode == "plain":
            return (s & 0xFFFFFFFF).to_bytes(4, "little") + bytes(bs - 4)
        if ivmode == "plain64":
            return (s % m).to_bytes(8, "little") + bytes(bs - 8)
        if ivmode == "plain64be":
            return bytes(bs - 8) + (s % m).to_bytes(8, "big")
        if ivmode == "essiv":
            salt = hashlib.new(ivopts, subkeys[k]).digest()
            return aes_ecb(salt, (s % m).to_bytes(8, "little") + bytes(8))
        if ivmode == "benbi":
            # The 1-based index of the sector's first cipher block.
            blocks_per_sector_shift = 9 - (bs.bit_length() - 1)
            return bytes(bs - 8) + (((s << blocks_per_sector_shift) + 1) % m).to_bytes(8, "big")
        if ivmode == "null":
            return bytes(bs)
        if ivmode == "eboiv":
            off = ((s * ss) % m).to_bytes(8, "little") + bytes(8)
            return chain_crypt(chain, subkeys[0], off, bytes(16), True)
        if ivmode == "tcw":
            le = (s % m).to_bytes(8, "little")
            return bytes(a ^ b for a, b in zip(tcw[0], (le + le)[:bs]))
        fail("unsupported IV mode %s" % ivmode)

    out = bytearray()
    for i in range(len(data) // ss):
        cc_sector = start + i * step + iv_offset
        k = cc_sector & (keycount - 1)
        iv = iv_for(cc_sector, k) if has_iv else None
        sector = data[i * ss:(i + 1) * ss]
        white = tcw_whitening(tcw[1], cc_sector % (1 << 64)) * (ss // 8) if tcw else None
        if white and not encrypt:
            sector = bytes(a ^ b for a, b in zip(sector, white))
        conv = chain_crypt(chain, subkeys[k], iv, sector, encrypt, cipher)
        if white and encrypt:
            conv = bytes(a ^ b for a, b in zip(conv, white))
        out += conv
    return bytes(out)


def batch():
    """One JSON object per input line -> one JSON object per output line."""
    for line in sys.stdin:
        if not line.strip():
            continue
        j = json.loads(line)
        try:
            key = b"" if j["key"] == "-" else bytes.fromhex(j["key"])
            out = convert(j["direction"], j["cipher"], key, j.get("sector_size", 512),
                          j.get("iv_offset", 0), j.get("iv_large_sectors", False),
                          j.get("start_sector", 0), bytes.fromhex(j["data"]))
            res = {"data": out.hex()}
        except (OracleError, ValueError) as e:
            res = {"error": str(e)}
        sys.stdout.write(json.dumps(res) + "\n")
        sys.stdout.flush()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "batch":
        batch()
        return
    ap = argparse.ArgumentParser(description="dm-crypt sector oracle")
    ap.add_argument("direction", choices=["encrypt", "decrypt"])
    ap.add_argument("--cipher", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--sector-size", type=int, default=512)
    ap.add_argument("--iv-offset", type=int, default=0)
    ap.add_argument("--iv-large-sectors", action="store_true")
    ap.add_argument("--start-sector", type=int, default=0)
    a = ap.parse_args()
    key = b"" if a.key == "-" else bytes.fromhex(a.key)
    try:
        out = convert(a.direction, a.cipher, key, a.sector_size, a.iv_offset,
                      a.iv_large_sectors, a.start_sector, sys.stdin.buffer.read())
    except OracleError as e:
        sys.stderr.write("dmcrypt.py: %s\n" % e)
        sys.exit(2)
    sys.stdout.buffer.write(out)


if __name__ == "__main__":
    main()
