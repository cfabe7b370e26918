#![no_main]
//! See `turnsafe_fuzz_checks::records::check_receipt` for what this target checks.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = turnsafe_fuzz_checks::records::check_receipt(data) {
        panic!("receipt: {e}");
    }
});
