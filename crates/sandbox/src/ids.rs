//! Identifiers handed to clients.

use rand::Rng;

/// A new sandbox id: 20 lowercase letters and digits (safe as a directory
/// name and in a `{port}-{id}.{domain}` host name).
pub fn new_sandbox_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    (0..20)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect()
}

/// A new access token: 48 hex digits from the OS's CSPRNG-seeded generator.
pub fn new_token() -> String {
    let mut bytes = [0u8; 24];
    rand::thread_rng().fill(&mut bytes[..]);
    hex::encode(bytes)
}
