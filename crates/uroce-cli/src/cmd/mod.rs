//! Subcommands.
pub mod decode;
pub mod demo;
pub mod devices;
