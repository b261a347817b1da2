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

/// Whether `id` can be a sandbox id: 1 to 64 ASCII letters and digits.
/// Anything else can name no sandbox, and must reach no path: an id read
/// from elsewhere (a peer's row in etcd, a request) is checked before it
/// is joined to a directory.
pub fn is_sandbox_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// A new access token: 48 hex digits from the OS's CSPRNG-seeded generator.
pub fn new_token() -> String {
    let mut bytes = [0u8; 24];
    rand::thread_rng().fill(&mut bytes[..]);
    hex::encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_letters_and_digits_are_sandbox_ids() {
        assert!(is_sandbox_id(&new_sandbox_id()));
        for bad in ["", "..", "../../../etc", "a/b", "a.b", &"a".repeat(65)] {
            assert!(!is_sandbox_id(bad), "{bad:?}");
        }
    }
}
