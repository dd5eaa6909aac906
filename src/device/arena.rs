//! Device memory for a recorded graph's planned device buffers: one
//! allocation per device per graph ([`DeviceMemory`]), taken and given back
//! in stream order, and the views of its slices that device work captures
//! ([`DeviceSlice`]).
//!
//! Only the backend's three primitives differ between devices; the
//! ordering around them is the same code for both:
//!
//! | | simulated GPU | CUDA |
//! | --- | --- | --- |
//! | alloc | a zeroed [`SimMemory`] of 64-byte lines | `cuMemAllocAsync` + `cuMemsetD8Async` on the lane |
//! | view | a [`SimView`] of the allocation, at an offset | the device pointer at the offset |
//! | free | the `SimMemory` dropped as the lane's own work | `cuMemFreeAsync` on the lane |
//!
//! **Taken** ([`DeviceMemory::alloc`]) by the first op of a replay that
//! reaches a device buffer, in its body, on the device's launcher: the
//! allocation is enqueued on the op's lane, an event recorded after it, and
//! every other lane of the device made to wait for that event, so whatever
//! any lane runs from then on runs after the allocation (once per graph).
//!
//! **Given back** when dropped (the graph's runtime drops it once no
//! replay can run any more): an event is recorded on every other lane, the
//! allocating lane waits for them all, and the free is enqueued there. So
//! the free runs after every piece of work enqueued on the device before it,
//! on any lane: it never races a kernel, even one still running when the
//! graph goes, and no thread waits for it (on a simulated device already
//! shut down, whose threads have all returned, it is freed at once). The
//! simulated device's free sets the `SimMemory`'s freed flag, so a view
//! used after it fails with "use after free" instead of reading freed
//! memory.
//!
//! On CUDA the calls are the driver's, made with the engine's context
//! current (the drop may run on any thread: the context current there
//! before is restored after).

// `unsafe`: the simulated views' casts from bytes to elements, and CUDA
// driver calls; each block says why it is sound.
#![allow(unsafe_code)]

use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use super::backend::{Backend, Gpu};
use super::sim::SimEvent;
use super::{SimMemory, SimView, Stream};

/// The simulated arena's unit: 64-byte aligned, so that every element type
/// is aligned at the offsets the plan aligns for it.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Line([u8; 64]);

/// The bytes of one allocation.
enum Raw {
    Sim(SimMemory<Line>),
    #[cfg(feature = "cuda")]
    Cuda(cudarc::driver::sys::CUdeviceptr),
}

/// One allocation of a stream device's memory for a graph's device
/// buffers: freed, in stream order, when dropped (see the module docs).
pub(crate) struct DeviceMemory {
    backend: Arc<Backend>,
    /// The lane it was allocated (and is freed) on.
    lane: u8,
    bytes: usize,
    /// Taken by the drop.
    raw: Option<Raw>,
    /// Counted up once the memory is actually given back.
    frees: Arc<AtomicUsize>,
}

impl std::fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceMemory")
            .field("lane", &self.lane)
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

impl DeviceMemory {
    /// `bytes` zeroed bytes of the device of `stream` (an op's, in its
    /// body), in the order of its lane; every other lane's later work is
    /// ordered after it. `frees` is counted up when it is given back.
    pub(crate) fn alloc(
        stream: &Stream,
        bytes: usize,
        frees: Arc<AtomicUsize>,
    ) -> Result<Self, String> {
        let backend = &stream.backend;
        let lane = stream.lane;
        backend
            .dead()
            .map_or(Ok(()), |e| Err(format!("the device is dead: {e}")))?;
        // A zero-sized arena still gets an allocation of its own.
        let size = bytes.max(1);
        let raw = match &backend.gpu {
            Gpu::Sim(_) => {
                // Fallibly: an arena too large fails the op, never aborts.
                let lines = size.div_ceil(64);
                let mut memory = Vec::new();
                memory.try_reserve_exact(lines).map_err(|_| {
                    format!("the simulated device's {bytes} bytes could not be allocated")
                })?;
                memory.resize(lines, Line([0; 64]));
                Raw::Sim(SimMemory::new(memory))
            }
            #[cfg(feature = "cuda")]
            Gpu::Cuda(gpu) => Raw::Cuda(cuda::alloc(gpu, lane, size)?),
        };
        let memory = Self {
            backend: backend.clone(),
            lane,
            bytes,
            raw: Some(raw),
            frees,
        };
        // The other lanes' later work runs after the allocation.
        let others: Vec<u8> = (0..memory.lanes()).filter(|&l| l != lane).collect();
        if let Err(e) = order(backend, &[lane], &others) {
            // Given back by the drop, but not counted: it was never handed out.
            let mut memory = memory;
            memory.frees = Arc::default();
            return Err(e);
        }
        Ok(memory)
    }

    fn lanes(&self) -> u8 {
        (self.backend.compute + 2) as u8
    }

    /// A view of `len` values of `T` from `offset` bytes in.
    ///
    /// # Safety
    ///
    /// `T` is a plain number type, for which any bytes are a value;
    /// `offset` is a multiple of `align_of::<T>()` (at most 64), and
    /// `offset + len * size_of::<T>()` is at most [`bytes`](Self::bytes).
    pub(crate) unsafe fn slice<T>(
        &self,
        offset: usize,
        len: usize,
        writable: bool,
    ) -> DeviceSlice<T> {
        debug_assert!(offset % align_of::<T>() == 0 && align_of::<T>() <= 64);
        debug_assert!(offset + len * size_of::<T>() <= self.bytes.max(1));
        let memory = match self.raw.as_ref().expect("taken only by the drop") {
            Raw::Sim(m) => View::Sim(m.view()),
            #[cfg(feature = "cuda")]
            Raw::Cuda(ptr) => View::Cuda(*ptr),
        };
        DeviceSlice::at(memory, offset, len, writable)
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        let Some(raw) = self.raw.take() else { return };
        let backend = &self.backend;
        // The allocating lane waits for every other lane's work so far
        // (only a dead device refuses, and it runs nothing more).
        let others: Vec<u8> = (0..self.lanes()).filter(|&l| l != self.lane).collect();
        let _ = order(backend, &others, &[self.lane]);
        let frees = self.frees.clone();
        match (raw, &backend.gpu) {
            (Raw::Sim(memory), Gpu::Sim(gpu)) => {
                let free = Freed {
                    memory: Some(memory),
                    frees,
                };
                if gpu.is_finished() {
                    // Shut down: nothing runs on the device any more.
                    drop(free);
                } else {
                    // Run by the lane's thread after its earlier work (a
                    // dead device drops it unrun: freed then).
                    gpu.run(self.lane, Box::new(move || drop(free)));
                }
            }
            #[cfg(feature = "cuda")]
            (Raw::Cuda(ptr), Gpu::Cuda(gpu)) => {
                cuda::free(gpu, self.lane, ptr);
                frees.fetch_add(1, SeqCst);
            }
            #[cfg(feature = "cuda")]
            _ => unreachable!("memory of another kind of device"),
        }
    }
}

/// Makes each lane of `to` wait, on the device, for the work enqueued so
/// far on each lane of `from`: an event recorded on each of `from`, waited
/// for by each of `to`. One-shot events, not the pool's: a pooled event is
/// reused once its fence is done, and these have no fence (a simulated
/// event reused early would satisfy these waits early).
fn order(backend: &Backend, from: &[u8], to: &[u8]) -> Result<(), String> {
    if let Some(e) = backend.dead() {
        return Err(format!("the device is dead: {e}"));
    }
    match &backend.gpu {
        Gpu::Sim(gpu) => {
            for &f in from {
                let event = Arc::new(SimEvent::default());
                let generation = event.next();
                gpu.signal(f, event.clone(), generation);
                for &t in to {
                    gpu.wait(t, event.clone(), generation);
                }
            }
            Ok(())
        }
        #[cfg(feature = "cuda")]
        Gpu::Cuda(gpu) => cuda::order(gpu, from, to),
    }
}

/// A simulated allocation being freed: counts itself once dropped.
struct Freed {
    memory: Option<SimMemory<Line>>,
    frees: Arc<AtomicUsize>,
}

impl Drop for Freed {
    fn drop(&mut self) {
        drop(self.memory.take());
        self.frees.fetch_add(1, SeqCst);
    }
}

std::thread_local! {
    /// The thread is inside a simulated slice's `with`.
    static REACHING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Clears [`REACHING`] when dropped (a panic in `f` included).
struct Reached;

impl Drop for Reached {
    fn drop(&mut self) {
        REACHING.with(|r| r.set(false));
    }
}

enum View {
    Sim(SimView<Line>),
    #[cfg(feature = "cuda")]
    Cuda(cudarc::driver::sys::CUdeviceptr),
}

/// A planned device buffer's slice of its graph's device memory, from
/// [`OpCtx::device_buffer`](crate::OpCtx::device_buffer): what device work
/// captures (as a kernel gets a device pointer). Cheap to clone, `'static`.
///
/// On the simulated GPU, [`with`](Self::with) and
/// [`with_mut`](Self::with_mut) reach the values from work on a stream
/// (`Stream::simulate`), and fail with "use after free" if the memory was
/// given back; on a CUDA device, `device_ptr` (feature
/// `cuda`) is the address to pass a kernel.
pub struct DeviceSlice<T> {
    memory: View,
    /// In bytes, from the allocation's start.
    offset: usize,
    len: usize,
    writable: bool,
    _values: PhantomData<fn() -> T>,
}

impl<T> Clone for DeviceSlice<T> {
    fn clone(&self) -> Self {
        let memory = match &self.memory {
            View::Sim(v) => View::Sim(v.clone()),
            #[cfg(feature = "cuda")]
            View::Cuda(p) => View::Cuda(*p),
        };
        Self::at(memory, self.offset, self.len, self.writable)
    }
}

impl<T> std::fmt::Debug for DeviceSlice<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceSlice")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("writable", &self.writable)
            .field("simulated", &matches!(self.memory, View::Sim(_)))
            .finish()
    }
}

impl<T> DeviceSlice<T> {
    /// `len` values of `T` at `offset` bytes into `memory`.
    fn at(memory: View, offset: usize, len: usize, writable: bool) -> Self {
        Self {
            memory,
            offset,
            len,
            writable,
            _values: PhantomData,
        }
    }

    /// How many values it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no value.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the op that took it may write through it (it declared the
    /// buffer mutated and took it with
    /// [`device_buffer_mut`](crate::OpCtx::device_buffer_mut)).
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// Its first byte's offset in its graph's device memory on this device.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The same bytes as values of `U`, for the views of this crate only.
    ///
    /// # Safety
    ///
    /// As for [`DeviceMemory::slice`], for `U` at this offset and `len`.
    pub(crate) unsafe fn recast<U>(&self, len: usize) -> DeviceSlice<U> {
        let this = self.clone();
        DeviceSlice::at(this.memory, this.offset, len, this.writable)
    }

    /// On the simulated GPU: runs `f` on the values (from device work),
    /// or reports a use after free. The simulated memory has one lock per
    /// graph and device: one `with` at a time per thread (copy what one
    /// slice holds out before reaching the next).
    ///
    /// # Errors
    ///
    /// "use after free" if the graph's device memory was given back before
    /// or while `f` ran; a `with` inside another's; on a CUDA device, that
    /// it is not simulated.
    pub fn with<R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R, String> {
        self.reach(|values| f(values))
    }

    /// As [`with`](Self::with), mutably.
    ///
    /// # Errors
    ///
    /// As for `with`, and a read-only slice (from
    /// [`device_buffer`](crate::OpCtx::device_buffer)) refuses.
    pub fn with_mut<R>(&self, f: impl FnOnce(&mut [T]) -> R) -> Result<R, String> {
        if !self.writable {
            return Err(
                "a read-only device slice (from `device_buffer`): take it with \
                 `device_buffer_mut` in an op that mutates the buffer"
                    .into(),
            );
        }
        self.reach(f)
    }

    fn reach<R>(&self, f: impl FnOnce(&mut [T]) -> R) -> Result<R, String> {
        let (offset, len) = (self.offset, self.len);
        match &self.memory {
            View::Sim(view) => {
                // The simulated allocation has one lock: a `with` inside
                // another would wait for itself.
                if REACHING.with(|r| r.replace(true)) {
                    return Err("a device slice's `with` inside another's: take what one \
                                slice holds first (`with(|x| x.to_vec())`), then reach the next"
                        .into());
                }
                let _done = Reached;
                view.with(|lines| {
                    let base: *mut u8 = lines.as_mut_ptr().cast();
                    // SAFETY: `slice` (or `recast`) was promised that `T` takes
                    // any bytes, that `offset` is aligned for it (the lines are
                    // 64-byte aligned) and that the range lies in the
                    // allocation; the allocation's lock is held for the borrow.
                    f(
                        unsafe {
                            std::slice::from_raw_parts_mut(base.add(offset).cast::<T>(), len)
                        },
                    )
                })
            }
            #[cfg(feature = "cuda")]
            View::Cuda(_) => Err("not a simulated device: pass `device_ptr` to a kernel".into()),
        }
    }

    /// On a CUDA device: the address of the first value, for a kernel's
    /// argument (`None` on the simulated GPU). Valid in the op's work and
    /// that of later ops of the same replays; the graph's drop frees it
    /// after all of that work.
    #[cfg(feature = "cuda")]
    pub fn device_ptr(&self) -> Option<cudarc::driver::sys::CUdeviceptr> {
        match &self.memory {
            View::Cuda(ptr) => Some(ptr + self.offset as u64),
            View::Sim(_) => None,
        }
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    //! The driver calls, with the engine's context current.

    use cudarc::driver::{result, sys};

    use super::super::backend::Settled;
    use super::super::cuda::CudaGpu;

    fn message(e: cudarc::driver::DriverError) -> String {
        crate::device::driver::describe_driver(&e)
    }

    /// Runs `f` with the engine's context current, then restores the
    /// calling thread's (a launcher or poller keeps the engine's anyway).
    fn in_context<R>(gpu: &CudaGpu, f: impl FnOnce() -> Result<R, String>) -> Result<R, String> {
        let _current = gpu.scoped()?;
        f()
    }

    /// As `arena::order`: a one-shot event per lane of `from` (destroyed
    /// at once: the driver keeps it until it completes, and a wait enqueued
    /// on it keeps the record it saw).
    pub(super) fn order(gpu: &CudaGpu, from: &[u8], to: &[u8]) -> Result<(), String> {
        in_context(gpu, || {
            for &f in from {
                let event = gpu.new_event()?;
                let waited = gpu
                    .record(f, &event)
                    .map_err(|s| match s {
                        Settled::Over(m) | Settled::Dead(m) => m,
                    })
                    .and_then(|()| to.iter().try_for_each(|&t| gpu.wait(t, &event)));
                gpu.destroy(event);
                waited?;
            }
            Ok(())
        })
    }

    /// `bytes` zeroed bytes, allocated in `lane`'s order.
    pub(super) fn alloc(gpu: &CudaGpu, lane: u8, bytes: usize) -> Result<sys::CUdeviceptr, String> {
        let stream = gpu.stream(lane);
        if !stream.context().has_async_alloc() {
            return Err(
                "the CUDA device has no stream-ordered allocator (memory pools), which device \
                 buffers need"
                    .into(),
            );
        }
        in_context(gpu, || {
            let cu = stream.cu_stream();
            // SAFETY: the stream is the engine's and alive; the memory is
            // only reached through views, after this in stream order.
            let ptr = unsafe { result::malloc_async(cu, bytes) }.map_err(message)?;
            // SAFETY: `ptr` holds `bytes` bytes, in the same stream's order.
            if let Err(e) = unsafe { result::memset_d8_async(ptr, 0, bytes, cu) } {
                // SAFETY: allocated just above, used by nothing yet.
                let _ = unsafe { result::free_async(ptr, cu) };
                return Err(message(e));
            }
            Ok(ptr)
        })
    }

    /// Gives `ptr` back in `lane`'s order (after everything the device's
    /// lanes held: the caller made `lane` wait for them).
    pub(super) fn free(gpu: &CudaGpu, lane: u8, ptr: sys::CUdeviceptr) {
        let _ = in_context(gpu, || {
            // SAFETY: allocated by `alloc` on this context, freed once; every
            // use of it was enqueued before on some lane of the device, and
            // this lane waits for all of them (stream order).
            unsafe { result::free_async(ptr, gpu.stream(lane).cu_stream()) }.map_err(message)
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::device::{Fence, Spec, StreamDevice};

    /// A stream of lane `lane` of `dev`, as an op's body gets one.
    fn stream(dev: &StreamDevice, lane: u8) -> Stream {
        let fence = Arc::new(Fence::new(0, lane, dev.backend.new_event().unwrap()));
        Stream::new(dev.backend.clone(), lane, fence)
    }

    /// Memory allocated on lane 0 and dropped while a kernel on lane 1
    /// still uses it is freed only after that kernel: the free waits for
    /// every lane. (Seen failing with the drop's waits removed: the kernel
    /// reports a use after free.)
    #[test]
    fn a_free_waits_for_the_work_of_every_lane() {
        let dev = StreamDevice::new("arena-test", &Spec::Sim { compute: 2 }).unwrap();
        let frees = Arc::new(AtomicUsize::new(0));
        let memory = DeviceMemory::alloc(&stream(&dev, 0), 64, frees.clone()).unwrap();
        // SAFETY: u64 takes any bytes; offset 0; 8 values are the 64 bytes.
        let view = unsafe { memory.slice::<u64>(0, 8, true) };
        let (entered_tx, entered) = mpsc::channel();
        let (open, gate) = mpsc::channel::<()>();
        let (result_tx, result) = mpsc::channel();
        let kernel = move || {
            entered_tx.send(()).unwrap();
            gate.recv().unwrap();
            result_tx.send(view.with_mut(|x| x.fill(1))).unwrap();
        };
        dev.backend.enqueue_work(1, Box::new(kernel)).unwrap();
        entered.recv().unwrap();
        drop(memory);
        assert_eq!(frees.load(SeqCst), 0, "freed under a running kernel");
        open.send(()).unwrap();
        let used = result.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(used, Ok(()));
        let start = Instant::now();
        while frees.load(SeqCst) == 0 {
            assert!(start.elapsed() < Duration::from_secs(30), "never freed");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(frees.load(SeqCst), 1);
    }

    /// Work on another lane than the allocation's sees zeroed memory.
    #[test]
    fn an_allocation_is_zeroed() {
        let dev = StreamDevice::new("arena-test", &Spec::Sim { compute: 2 }).unwrap();
        let memory = DeviceMemory::alloc(&stream(&dev, 1), 24, Arc::default()).unwrap();
        // SAFETY: u32 takes any bytes; 6 values are the 24 bytes.
        let view = unsafe { memory.slice::<u32>(0, 6, false) };
        let (tx, rx) = mpsc::channel();
        let read = move || tx.send(view.with(|x| x.to_vec())).unwrap();
        dev.backend.enqueue_work(0, Box::new(read)).unwrap();
        let got = rx.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(got, Ok(vec![0; 6]));
        drop(memory);
    }
}
