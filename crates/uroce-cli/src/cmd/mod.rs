//! Subcommands.
pub mod bench;
pub mod capture;
pub mod decode;
pub mod demo;
pub mod devices;
pub mod peers;
pub mod stat;
pub mod table;
