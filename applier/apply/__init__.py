"""Writing downstream: the transaction unit of a window, DDL execution and the catalogue checks it
relies on. One path for the daemon and the catch-up."""
