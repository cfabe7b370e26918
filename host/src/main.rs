fn main() {
    std::process::exit(turnsafe_host::cli::main());
}
