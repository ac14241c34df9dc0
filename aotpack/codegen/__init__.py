"""Stage 6: CppWrapper code generation with the winners baked in."""
