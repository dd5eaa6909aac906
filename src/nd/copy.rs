//! Copies between devices: one op on the destination's device that reads
//! the source and writes the destination.

use super::shape::{host_device, misfit};
use super::{Array, mode};
use crate::dep::Device;
use crate::error::Error;

impl Array {
    /// A copy of the array on `device` (of the same engine): seed 000's
    /// `copyto`, as a new array. The copy runs on `device`, in program
    /// order after the operations that write `self`.
    ///
    /// ```
    /// use depflow::{Engine, Error, Executor, nd};
    ///
    /// let engine = Engine::builder().device("gpu1", Executor::pool(1)).build()?;
    /// let arrays = nd::Arrays::new(&engine);
    /// let a = arrays.ones(&[2])?;
    /// let b = a.to(engine.device("gpu1").unwrap())?;
    /// assert_eq!(b.device().index(), 1);
    /// assert_eq!(b.to_vec().wait()?, [1.0, 1.0]);
    /// # Ok::<(), Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Array`] if `device` is not a device of the array's engine,
    /// or is a stream device (see [`Arrays::on`](super::Arrays::on)).
    pub fn to(&self, device: Device) -> Result<Array, Error> {
        host_device("to", self.engine(), device).map_err(|e| match e {
            Error::Array { op, message } => Error::Array {
                op,
                message: format!("{message} (the array's shape: {:?})", self.shape()).into(),
            },
            e => e,
        })?;
        let result = Array::uninit(self.engine(), device, self.shape_arc().clone());
        copy(self, &result)?;
        Ok(result.tracked("to", &[self], |_| {
            let from = self.device();
            Box::new(move |dy| Ok(vec![Some(dy.to(from)?)]))
        }))
    }

    /// Copies the values into `dest`, an array of the same shape on any
    /// device of the same engine (the copy runs on `dest`'s device).
    ///
    /// # Errors
    ///
    /// [`Error::Array`] if the shapes differ or `dest` belongs to another
    /// engine.
    pub fn copy_to(&self, dest: &Array) -> Result<(), Error> {
        dest.writable("copy_to")?;
        if self.shape() != dest.shape() {
            return Err(misfit(
                "copy_to",
                format!("shapes {:?} and {:?} differ", self.shape(), dest.shape()),
            ));
        }
        if self.engine().device_name(dest.device()).is_none() {
            return Err(misfit(
                "copy_to",
                "the destination belongs to another engine",
            ));
        }
        copy(self, dest)
    }
}

fn copy(from: &Array, to: &Array) -> Result<(), Error> {
    if from.shares_data(to) {
        return Ok(());
    }
    let (x, o) = (from.buffer().clone(), to.buffer().clone());
    mode::submit(
        from.engine(),
        to.device(),
        "copy",
        &[from.buffer()],
        &[to.buffer()],
        move |ctx| {
            ctx.write(&o)?.copy_from_slice(&ctx.read(&x)?);
            Ok(())
        },
    )
}
