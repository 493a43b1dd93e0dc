# The saturated matrix's workloads, sourced by matrix.sh and lead_matrix.sh (one table:
# a workload added here runs in both). Needs $syn (the stress traces' folder, made by
# stress_traces.py) and $tr (the shared traces); sets TRACES[name]="sim flags".
declare -A TRACES=(
  [r1]="--trace $tr/servegen/deepseek_r1_5rps_1h.csv --min-output 1001"
  [mooncake]="--trace $tr/mooncake/conversation_trace.jsonl"
  [azure_conv]="--trace $tr/azure2023/AzureLLMInferenceTrace_conv.csv"
  [chat_rag]="--trace $syn/chat_rag.jsonl --format jsonl"
  [reasoning]="--trace $syn/reasoning.jsonl --format jsonl"
)
