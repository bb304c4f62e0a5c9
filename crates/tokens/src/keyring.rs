//! `luks2-keyring`: the passphrase is a `user` key in the kernel keyring,
//! found by its description as cryptsetup's `keyring_get_passphrase` finds
//! it (`request_key(2)`, which searches the thread, process and session
//! keyrings), then read with `keyctl(KEYCTL_READ)`.
//!
//! Hand-written over two system calls (libc has no wrappers for them and
//! the calls are all this needs).

use std::ffi::CString;

use crypto::Secret;

use crate::Error;

/// `KEYCTL_READ` from `<linux/keyctl.h>`.
const KEYCTL_READ: libc::c_long = 11;

/// The payload of the `user` key described by `description`.
pub fn passphrase(description: &str) -> Result<Secret, Error> {
    let desc = CString::new(description)
        .map_err(|_| Error::malformed("key description holds a NUL byte".into()))?;
    let ty = c"user";
    // SAFETY: both strings are NUL-terminated and live across the call;
    // the callout info is NULL (no upcall) and the destination keyring 0.
    let id = unsafe {
        libc::syscall(
            libc::SYS_request_key,
            ty.as_ptr(),
            desc.as_ptr(),
            std::ptr::null::<libc::c_char>(),
            0 as libc::c_long,
        )
    };
    if id < 0 {
        let e = std::io::Error::last_os_error();
        return Err(Error::unavailable(format!(
            "Cannot find key \"{description}\" in the kernel keyring: {e}"
        )));
    }
    let mut buf = Secret::zeroed(4096);
    loop {
        let cap = buf.len();
        // SAFETY: `buf` holds `cap` writable bytes for the whole call; the
        // kernel writes at most `cap` of them and returns the key's size.
        let n = unsafe {
            libc::syscall(
                libc::SYS_keyctl,
                KEYCTL_READ,
                id,
                buf.as_mut_ptr(),
                cap as libc::c_long,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return Err(Error::unavailable(format!(
                "Cannot read key \"{description}\" from the kernel keyring: {e}"
            )));
        }
        let n = n as usize;
        if n <= cap {
            buf.truncate(n);
            return Ok(buf);
        }
        buf = Secret::zeroed(n);
    }
}
