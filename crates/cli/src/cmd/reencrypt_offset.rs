//! `reencrypt --encrypt --offset SECTORS`, as cryptsetup 2.6.1's
//! `encrypt_luks2_init` reads it: with a detached `--header` the data
//! starts at the offset (the bytes before it are kept as they are);
//! with `--reduce-device-size R` and the header inside the device the
//! offset may not pass R/2, and one below it makes R twice the offset
//! (said on stdout). cryptsetup ignores `--offset` of any other
//! reencryption, and so does ucrypt.

use super::reencrypt::ReencryptArgs;
use crate::Failure;

/// `--reduce-device-size` after the offset's adjustment and the data
/// offset in bytes of a detached header, both for a new encryption.
pub(super) fn layout(a: &ReencryptArgs) -> Result<(Option<u64>, Option<u64>), Failure> {
    let offset = a.offset.filter(|&o| o != 0);
    match (&a.header, a.reduce_device_size, offset) {
        (None, Some(r), Some(o)) => {
            let half = r / (2 * 512);
            if o > half {
                return Err(Failure::usage(
                    "Requested data offset must be less than or equal to half of \
                     --reduce-device-size parameter.",
                ));
            }
            if o < half {
                println!(
                    "Adjusting --reduce-device-size value to twice the --offset {} (sectors).",
                    o * 2
                );
            }
            Ok((Some(o * 2 * 512), None))
        }
        (Some(_), r, Some(o)) => {
            let bytes = o
                .checked_mul(512)
                .ok_or_else(|| Failure::usage("Requested data offset is too large."))?;
            Ok((r, Some(bytes)))
        }
        (_, r, _) => Ok((r, None)),
    }
}
