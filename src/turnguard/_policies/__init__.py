"""Built-in policy plugins: small functions that read the ledger and return verdicts."""
