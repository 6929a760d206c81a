"""Layer 4: robustness stress tests — prompt, image and audio operators (`ops`, `ops_audio`) and
the report with paired statistics (`run`)."""
