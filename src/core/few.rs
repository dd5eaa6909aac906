//! The one small collection the layers share: a list kept inline while it
//! holds one or two elements, on the heap otherwise.
//!
//! Most ops touch one or two variables, need units of one resource, and
//! grant or release one or two others; an allocation per such list would
//! double their cost. Not a state machine: plain data, owned by one thread
//! at a time.
//!
//! Three shapes, so that reading it as a slice (the hot operation) is one
//! three-way branch; the empty list is an empty `Vec`, which allocates
//! nothing.

use std::fmt;

/// One or two elements inline, none or more than two in a `Vec`.
pub enum Few<T> {
    One(T),
    Two([T; 2]),
    Many(Vec<T>),
}

impl<T> Default for Few<T> {
    #[inline]
    fn default() -> Self {
        Few::Many(Vec::new())
    }
}

impl<T> Few<T> {
    /// `n` elements, the `i`th made by `f(i)`; allocates only for `n > 2`.
    #[inline]
    pub fn from_fn(n: usize, mut f: impl FnMut(usize) -> T) -> Self {
        match n {
            1 => Few::One(f(0)),
            2 => Few::Two([f(0), f(1)]),
            _ => Few::Many((0..n).map(f).collect()),
        }
    }

    /// Appends clones of `values`: for an empty list, as one step.
    #[inline]
    pub fn extend_from_slice(&mut self, values: &[T])
    where
        T: Clone,
    {
        if matches!(self, Few::Many(v) if v.capacity() == 0) {
            let new = match values {
                [a] => Few::One(a.clone()),
                [a, b] => Few::Two([a.clone(), b.clone()]),
                _ => Few::Many(values.to_vec()),
            };
            // Replacing an empty, unallocated `Vec`: nothing to drop.
            std::mem::forget(std::mem::replace(self, new));
        } else {
            values.iter().for_each(|v| self.push(v.clone()));
        }
    }

    /// Appends `value`.
    #[inline]
    pub fn push(&mut self, value: T) {
        match self {
            Few::Many(values) if values.capacity() == 0 => {
                // Replacing an empty, unallocated `Vec`: nothing to drop.
                std::mem::forget(std::mem::replace(self, Few::One(value)));
            }
            Few::Many(values) => values.push(value),
            _ => self.spill(value),
        }
    }

    /// Appends `value` to a list of one or two: the rare, moving case.
    #[cold]
    fn spill(&mut self, value: T) {
        *self = match std::mem::take(self) {
            Few::One(a) => Few::Two([a, value]),
            Few::Two([a, b]) => Few::Many(vec![a, b, value]),
            Few::Many(mut values) => {
                values.push(value);
                Few::Many(values)
            }
        };
    }

    #[inline]
    pub fn as_slice(&self) -> &[T] {
        match self {
            Few::One(a) => std::slice::from_ref(a),
            Few::Two(a) => a,
            Few::Many(v) => v,
        }
    }

    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        match self {
            Few::One(a) => std::slice::from_mut(a),
            Few::Two(a) => a,
            Few::Many(v) => v,
        }
    }

    /// Calls `f` with each element, in order, consuming the list.
    #[inline]
    pub fn for_each(self, mut f: impl FnMut(T)) {
        match self {
            Few::One(a) => f(a),
            Few::Two([a, b]) => {
                f(a);
                f(b);
            }
            Few::Many(v) => v.into_iter().for_each(f),
        }
    }
}

impl<T> std::ops::Deref for Few<T> {
    type Target = [T];
    #[inline]
    fn deref(&self) -> &[T] {
        self.as_slice()
    }
}

impl<T> std::ops::DerefMut for Few<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        self.as_mut_slice()
    }
}

impl<T> FromIterator<T> for Few<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut few = Few::default();
        iter.into_iter().for_each(|v| few.push(v));
        few
    }
}

impl<'a, T> IntoIterator for &'a Few<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<'a, T> IntoIterator for &'a mut Few<T> {
    type Item = &'a mut T;
    type IntoIter = std::slice::IterMut<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter_mut()
    }
}

impl<T: fmt::Debug> fmt::Debug for Few<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::Few;

    #[test]
    fn grows_from_inline_to_the_heap_in_order() {
        let mut few = Few::default();
        assert!(few.is_empty());
        for i in 0..5 {
            assert_eq!(few.len(), i);
            few.push(i);
            assert_eq!(few.as_slice(), (0..=i).collect::<Vec<_>>());
        }
        assert!(matches!(few, Few::Many(_)));
        let mut seen = Vec::new();
        few.for_each(|i| seen.push(i));
        assert_eq!(seen, [0, 1, 2, 3, 4]);
        let two: Few<_> = Few::from_fn(2, |i| i * 10);
        assert!(matches!(two, Few::Two(_)));
        assert_eq!(two.as_slice(), [0, 10]);
        assert!(Few::from_fn(0, |i| i).is_empty());
    }
}
