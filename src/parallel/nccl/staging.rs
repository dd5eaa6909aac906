//! One all-reduce's buffers ([`Staging`]): per device pinned host memory
//! and device memory of its length, allocated once; and a run's hold on
//! them ([`Held`]), which waits for the streams before it puts them back
//! if the devices may still use them.
//!
//! Owns the buffers; the streams that use them are [`Comms`]'s.

// `unsafe`: pinned memory, zeroed before it is read; each block says why it
// is sound.
#![allow(unsafe_code)]

use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{CudaContext, CudaSlice, PinnedHostSlice};

use super::comms::Comms;
use super::driver::driver_message;

/// One device's buffers: pinned host memory and device memory of the
/// all-reduce's length, allocated through the rank's context.
pub(super) struct Staged {
    pub(super) ctx: Arc<CudaContext>,
    pub(super) host: PinnedHostSlice<f32>,
    pub(super) dev: CudaSlice<f32>,
}

impl Drop for Staged {
    fn drop(&mut self) {
        // The buffers are freed through the current context (cudarc does
        // not bind it for a drop).
        let _ = self.ctx.bind_to_thread();
    }
}

/// One all-reduce's buffers, one [`Staged`] per device.
pub(super) struct Staging(pub(super) Vec<Staged>);

impl Staging {
    /// The floats per device.
    pub(super) fn len(&self) -> usize {
        self.0.first().map_or(0, |s| s.dev.len())
    }

    pub(super) fn new(comms: &Comms, len: usize) -> Result<Self, String> {
        let mut staged = Vec::with_capacity(comms.ranks.len());
        for r in &comms.ranks {
            // SAFETY: the memory is zeroed below before any slice of it is
            // made (flags 0: cached, as the host reads it back).
            let mut host =
                unsafe { r.ctx.alloc_pinned_with_flags::<f32>(len, 0) }.map_err(driver_message)?;
            let ptr = host.as_mut_ptr().map_err(driver_message)?;
            // SAFETY: `ptr` is `len` floats of host memory just allocated,
            // unused by any stream yet.
            unsafe { std::ptr::write_bytes(ptr, 0, len) };
            let dev = r.stream.alloc_zeros::<f32>(len).map_err(driver_message)?;
            staged.push(Staged {
                ctx: r.ctx.clone(),
                host,
                dev,
            });
        }
        Ok(Self(staged))
    }
}

/// Where an all-reduce keeps its [`Staging`] between runs.
pub(super) type Slot = Arc<Mutex<Option<Staging>>>;

/// A run's hold on the staging: puts it back when dropped, after waiting
/// for the streams if the devices may still use it (the op was dropped
/// while awaiting, or failed after issuing).
pub(super) struct Held {
    pub(super) slot: Slot,
    pub(super) comms: Arc<Comms>,
    pub(super) staging: Option<Staging>,
    pub(super) in_flight: bool,
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.in_flight {
            self.comms.synchronize();
        }
        *self.slot.lock().unwrap_or_else(PoisonError::into_inner) = self.staging.take();
    }
}
