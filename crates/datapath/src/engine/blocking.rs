//! The blocking helpers ([`Engine::read`], [`Engine::write`], ...): one
//! request submitted and waited for, a plug of one. Called from a callback
//! on an engine thread they can wait on themselves; use `submit` there. A
//! caller holding a [`Plug`] settles it first ([`Plug::settle`]): what
//! it gathered holds queue slots, and a helper's request runs after what
//! the plug submitted only then.

use std::sync::{Arc, Condvar, Mutex};

use super::submit::dispatch;
use super::Engine;
use crate::mode::gather::Plug;
use crate::{Completion, Error, Op, Request};

impl Engine {
    /// Submits and waits for the completion.
    fn run(&self, req: Request) -> Completion {
        let slot = Arc::new((Mutex::new(None), Condvar::new()));
        let s2 = slot.clone();
        // Not trampolined: a blocking helper called from a callback must
        // run now, not after the callback (which is waiting for it).
        // Without a hint nothing is gathered: the plug stays empty.
        dispatch(
            &self.core,
            &mut Plug::new(),
            req,
            move |c| {
                *s2.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(c);
                s2.1.notify_one();
            },
            false,
            None,
        );
        let mut g = slot.0.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(c) = g.take() {
                return c;
            }
            g = slot.1.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Blocking read helper.
    pub fn read(&self, offset: u64, len: u32) -> Result<Vec<u8>, Error> {
        self.run(Request {
            op: Op::Read { len },
            offset,
            fua: false,
        })
        .map(|d| d.unwrap_or_default())
    }

    /// Blocking write helper.
    pub fn write(&self, offset: u64, data: Vec<u8>, fua: bool) -> Result<(), Error> {
        self.run(Request {
            op: Op::Write { data },
            offset,
            fua,
        })
        .map(|_| ())
    }

    /// Blocking flush helper.
    pub fn flush(&self) -> Result<(), Error> {
        self.run(Request {
            op: Op::Flush,
            offset: 0,
            fua: false,
        })
        .map(|_| ())
    }

    /// Blocking discard helper.
    pub fn discard(&self, offset: u64, len: u32) -> Result<(), Error> {
        self.run(Request {
            op: Op::Discard { len },
            offset,
            fua: false,
        })
        .map(|_| ())
    }

    /// Blocking write-zeroes helper.
    pub fn write_zeroes(&self, offset: u64, len: u32, fua: bool) -> Result<(), Error> {
        self.run(Request {
            op: Op::WriteZeroes { len },
            offset,
            fua,
        })
        .map(|_| ())
    }
}
