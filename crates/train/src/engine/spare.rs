//! Large buffers kept per thread from one step to the next. The kernels lease their scratch
//! and the buffers a step keeps for its backward pass here, and a lease goes back to the
//! thread that drops it, so once warm a step allocates none of them: mimalloc keeps the
//! pages of every large buffer freed, and a process that allocated tens of them a step saw
//! its resident memory creep while its live heap stayed flat.

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};

/// Buffers a thread keeps at most, of each element type.
const KEPT: usize = 8;

/// An element type with a list of spare buffers per thread.
pub(crate) trait Spare: Copy + Default + 'static {
    /// Runs `f` on this thread's spare buffers of this type (none while the thread exits).
    fn with_spares<R>(f: impl FnOnce(&mut Vec<Vec<Self>>) -> R) -> Option<R>;
}

macro_rules! spares_of {
    ($t:ty) => {
        impl Spare for $t {
            fn with_spares<R>(f: impl FnOnce(&mut Vec<Vec<Self>>) -> R) -> Option<R> {
                thread_local! {
                    static SPARES: RefCell<Vec<Vec<$t>>> = const { RefCell::new(Vec::new()) };
                }
                SPARES.try_with(|s| f(&mut s.borrow_mut())).ok()
            }
        }
    };
}

spares_of!(f32);
spares_of!(u32);

/// A buffer leased from this thread's spares, given back to the dropping thread's.
pub(crate) struct Lease<T: Spare>(Vec<T>);

impl<T: Spare> Lease<T> {
    /// `len` values, each `value`.
    pub(crate) fn filled(len: usize, value: T) -> Self {
        let mut v = take::<T>(len);
        v.clear();
        v.resize(len, value);
        Self(v)
    }

    /// `len` values, what a previous lease left in them (the default value past it).
    pub(crate) fn reused(len: usize) -> Self {
        let mut v = take::<T>(len);
        v.resize(len, T::default());
        Self(v)
    }
}

/// The spare that holds `len` values with the least room, else the largest (empty where
/// the thread has none).
fn take<T: Spare>(len: usize) -> Vec<T> {
    T::with_spares(|list| {
        let fits = (0..list.len()).filter(|&i| list[i].capacity() >= len);
        let at = fits.min_by_key(|&i| list[i].capacity());
        let at = at.or_else(|| (0..list.len()).max_by_key(|&i| list[i].capacity()));
        at.map(|i| list.swap_remove(i))
    })
    .flatten()
    .unwrap_or_default()
}

impl<T: Spare> Drop for Lease<T> {
    fn drop(&mut self) {
        let v = std::mem::take(&mut self.0);
        if v.capacity() == 0 {
            return;
        }
        T::with_spares(|list| {
            list.push(v);
            if list.len() > KEPT {
                let smallest = (0..list.len()).min_by_key(|&i| list[i].capacity());
                smallest.map(|i| list.swap_remove(i))
            } else {
                None
            }
        });
    }
}

impl<T: Spare> Deref for Lease<T> {
    type Target = Vec<T>;

    fn deref(&self) -> &Vec<T> {
        &self.0
    }
}

impl<T: Spare> DerefMut for Lease<T> {
    fn deref_mut(&mut self) -> &mut Vec<T> {
        &mut self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_lease_serves_the_next_of_its_size() {
        let first = Lease::<f32>::filled(1 << 18, 1.0);
        let at = first.as_ptr();
        drop(first);
        let again = Lease::<f32>::reused(1 << 17);
        assert_eq!(again.as_ptr(), at);
        assert!(again.iter().all(|&v| v == 1.0));
        let zeroed = Lease::<f32>::filled(1 << 17, 0.0);
        assert!(zeroed.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn a_thread_keeps_at_most_its_limit() {
        let leases: Vec<_> = (1..=2 * KEPT).map(|n| Lease::<u32>::filled(n, 7)).collect();
        drop(leases);
        let kept = u32::with_spares(|list| list.len()).unwrap_or(0);
        assert_eq!(kept, KEPT);
    }
}
