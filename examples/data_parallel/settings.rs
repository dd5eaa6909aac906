//! The training both data-parallel examples run (`data_parallel`, over
//! local devices, and `mpi_train`, across ranks too): its seed, batch,
//! layers, optimizer, and the accuracy they check.

use super::data::{CLASSES, FEATURES};

pub const SEED: u64 = 42;
/// The (global) batch, split over the devices (and ranks).
pub const BATCH: usize = 128;
pub const HIDDEN: [usize; 3] = [64, 256, 256];
pub const LEARNING_RATE: f32 = 0.2;
/// With this many epochs or more, the run fails below this accuracy.
pub const CHECKED_FROM: usize = 5;
pub const MIN_ACCURACY: f64 = 0.9;

/// The width of every layer, input and output included.
pub fn layers() -> Vec<usize> {
    let mut dims = vec![FEATURES];
    dims.extend(HIDDEN);
    dims.push(CLASSES);
    dims
}

/// The update: plain SGD at [`LEARNING_RATE`].
pub fn sgd(w: &mut [f32], g: &[f32]) {
    w.iter_mut()
        .zip(g)
        .for_each(|(w, g)| *w -= LEARNING_RATE * g)
}
