//! Errors of the format crate. Every message names the source (file path or `<memory>`) and, where one
//! applies, the byte offset, so a user can find the damage with `xxd -s OFFSET`.

use std::io;

/// A failure to read or write an `.ocl` file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The operating system refused a read or write.
    #[error("{path}: {error}")]
    Io {
        /// File (or `<memory>`) being read or written.
        path: String,
        /// The underlying error. Part of the message rather than a chained source, so the message is
        /// complete on its own and `{:#}` chains do not repeat it.
        error: io::Error,
    },

    /// The file does not start with the Ocular magic.
    #[error("{path} is not an Ocular trace: bytes at offset 0 are {found}, expected {expected}")]
    NotOcular {
        /// File being read.
        path: String,
        /// What was found, as hex.
        found: String,
        /// The magic, as hex.
        expected: String,
    },

    /// The file is shorter than its preamble and header: nothing in it can be read.
    #[error("{path} is truncated at offset {offset}: {what}")]
    Truncated {
        /// File being read.
        path: String,
        /// Where the data ended.
        offset: u64,
        /// What was missing.
        what: String,
    },

    /// The file was written by a newer major version of the format.
    #[error(
        "{path} uses .ocl format {major}.{minor}, but this Ocular reads formats up to {supported_major}.x: \
         upgrade Ocular to read it"
    )]
    UnsupportedVersion {
        /// File being read.
        path: String,
        /// Major version in the file.
        major: u16,
        /// Minor version in the file.
        minor: u16,
        /// Newest major version this reader knows.
        supported_major: u16,
    },

    /// A chunk is damaged.
    #[error("{path}: corrupt chunk at offset {offset}: {what}")]
    Corrupt {
        /// File being read.
        path: String,
        /// Byte offset of the chunk (or of the damaged field).
        offset: u64,
        /// What is wrong.
        what: String,
    },

    /// A metadata record could not be encoded (a bug, not bad input).
    #[error("cannot encode {what}: {source}")]
    Encode {
        /// Which record.
        what: &'static str,
        /// The serializer's error.
        #[source]
        source: postcard::Error,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
