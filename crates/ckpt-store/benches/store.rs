// Placeholder so the workspace parses until the store bench lands.
fn main() {}
