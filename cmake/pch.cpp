// The translation unit that builds the precompiled header the project's programs reuse.
