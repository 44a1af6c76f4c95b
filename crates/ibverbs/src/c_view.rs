//! `CView<T>`: the structure a C program sees (`ibv_cq`, `ibv_qp_ex`, ...)
//! as the first field of our object.
//!
//! The program owns those bytes as much as we do: it writes `cq_context`,
//! `qp_context` and `comp_events_completed`, locks the `mutex` and waits on
//! the `cond` inside them, from any thread, while we hold a `&` to our
//! object. A plain field would let that `&` claim the bytes are frozen,
//! which the program breaks at will. Inside an `UnsafeCell` they are never
//! covered by a Rust reference: we read and write single fields through
//! the raw pointer, as the C code does.

use std::cell::UnsafeCell;

#[repr(transparent)]
pub struct CView<T>(UnsafeCell<T>);

// SAFETY: the cell is only accessed through raw pointers, one field at a
// time, under the same rules the C program follows (verbs' threading
// rules for each object).
unsafe impl<T> Sync for CView<T> {}

impl<T> CView<T> {
    pub fn new(value: T) -> CView<T> {
        CView(UnsafeCell::new(value))
    }

    /// The pointer the program holds.
    pub fn get(&self) -> *mut T {
        self.0.get()
    }
}
