//! The `alloc` names every module uses, so the same code builds with and
//! without std.

pub use alloc::boxed::Box;
pub use alloc::string::{String, ToString};
pub use alloc::vec::Vec;
