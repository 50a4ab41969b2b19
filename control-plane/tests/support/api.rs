//! The in-process server fixture lives in the library (feature `testkit`)
//! so that the scheduler's and controllers' tests share it.
#![allow(unused_imports)]
pub use skiff_control_plane::testkit::*;
