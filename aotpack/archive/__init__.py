"""Stage 7: the versioned archive: its layout, writer, reader and signatures."""
