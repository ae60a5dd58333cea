"""Loading Hugging Face causal LMs (loader), reading their configs (hf_config) and scoring a
sequence through our attention (scoring).

Never schedules or runs steps.
"""
