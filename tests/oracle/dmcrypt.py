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
                  aes:2-cbc-essiv:sha256, aes-ecb, cipher_null-ecb) or capi form
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
Exit status 2 with a message on stderr for anything it cannot compute.
"""

import argparse
import hashlib
import json
import sys

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes


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


def aes_ecb(key, data, encrypt=True):
    c = Cipher(algorithms.AES(key), modes.ECB())
    op = c.encryptor() if encrypt else c.decryptor()
    return op.update(data) + op.finalize()


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


def chain_crypt(chain, key, iv, data, encrypt):
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
    if cipher != "aes":
        fail("unsupported cipher " + cipher)
    if keycount < 1 or len(key) % keycount:
        fail("key does not split into keycount parts")
    sub = len(key) // keycount
    subkeys = [key[i * sub:(i + 1) * sub] for i in range(keycount)]
    has_iv = chain != "ecb"
    if has_iv and ivmode is None:
        fail("IV mechanism required")

    def iv_for(cc_sector, k):
        s = (cc_sector >> shift) if large else cc_sector
        m = 1 << 64
        if ivmode == "plain":
            return (s & 0xFFFFFFFF).to_bytes(4, "little") + bytes(12)
        if ivmode == "plain64":
            return (s % m).to_bytes(8, "little") + bytes(8)
        if ivmode == "plain64be":
            return bytes(8) + (s % m).to_bytes(8, "big")
        if ivmode == "essiv":
            salt = hashlib.new(ivopts, subkeys[k]).digest()
            return aes_ecb(salt, (s % m).to_bytes(8, "little") + bytes(8))
        if ivmode == "benbi":
            return bytes(8) + (((s << 5) + 1) % m).to_bytes(8, "big")
        if ivmode == "null":
            return bytes(16)
        if ivmode == "eboiv":
            off = ((s * ss) % m).to_bytes(8, "little") + bytes(8)
            return chain_crypt(chain, subkeys[0], off, bytes(16), True)
        fail("unsupported IV mode %s" % ivmode)

    out = bytearray()
    for i in range(len(data) // ss):
        cc_sector = start + i * step + iv_offset
        k = cc_sector & (keycount - 1)
        iv = iv_for(cc_sector, k) if has_iv else None
        out += chain_crypt(chain, subkeys[k], iv, data[i * ss:(i + 1) * ss], encrypt)
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
