"""The pipeline's step functions: resolve, authorize, execute, finalize, and the
circuit transitions beside them; each turns an event and the views into events."""
