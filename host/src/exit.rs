//! Semantic exit codes, in the sysexits spirit. Documented in README.md.

/// Everything asked for was done.
pub const OK: i32 = 0;
/// An internal or I/O failure of turnsafe itself.
pub const FAILURE: i32 = 1;
/// The command line was wrong (clap's own code).
pub const USAGE: i32 = 2;
/// At least one batch was not persisted (diverted, failed or handed back).
pub const NOT_PERSISTED: i32 = 3;
/// A verification found messages not accounted for exactly once.
pub const UNACCOUNTED: i32 = 4;
/// A command refused to act because doing so could lose data (a live
/// lease, a capture not yet settled, or a process still holding a file it
/// would replace).
pub const REFUSED: i32 = 5;
/// `doctor` found problems.
pub const PROBLEMS: i32 = 6;
/// A read was answered, but the history it shows is not complete: an
/// unsettled capture holds rows of the session that the database lacks.
pub const INCOMPLETE: i32 = 7;
/// At least one input line could not be read as the command expects.
pub const DATAERR: i32 = 65;
