"""Programs the store tests run as child processes."""
