import jax

# Reference comparisons run in float32 on the CPU; keep JAX from grabbing other
# backends and make every failure reproducible.
jax.config.update("jax_platforms", "cpu")
