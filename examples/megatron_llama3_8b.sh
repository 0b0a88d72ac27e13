#!/bin/bash
# Llama 3 8B pretraining with Megatron-LM (NVIDIA/Megatron-LM v0.15.3) on one 8-GPU node:
# tensor parallel 2 with sequence parallelism, data parallel 4, the distributed optimizer with overlapped
# gradient reduction and parameter gathers, selective recomputation, bf16.
# Simulate it:  pipesim simulate --from-megatron examples/megatron_llama3_8b.sh --hardware dgx-h100
torchrun --nproc-per-node 8 --nnodes 1 --master-addr localhost --master-port 6000 \
    pretrain_gpt.py \
    --tensor-model-parallel-size 2 \
    --pipeline-model-parallel-size 1 \
    --sequence-parallel \
    --use-distributed-optimizer \
    --overlap-grad-reduce \
    --overlap-param-gather \
    --num-layers 32 \
    --hidden-size 4096 \
    --ffn-hidden-size 14336 \
    --num-attention-heads 32 \
    --group-query-attention \
    --num-query-groups 8 \
    --kv-channels 128 \
    --swiglu \
    --normalization RMSNorm \
    --norm-epsilon 1e-5 \
    --disable-bias-linear \
    --position-embedding-type rope \
    --rotary-base 500000 \
    --untie-embeddings-and-output-weights \
    --hidden-dropout 0.0 \
    --attention-dropout 0.0 \
    --max-position-embeddings 8192 \
    --seq-length 8192 \
    --micro-batch-size 1 \
    --global-batch-size 128 \
    --bf16 \
    --attention-backend fused \
    --recompute-granularity selective \
    --cross-entropy-loss-fusion \
    --tokenizer-type HuggingFaceTokenizer \
    --tokenizer-model meta-llama/Meta-Llama-3-8B \
    --vocab-size 128256 \
    --make-vocab-size-divisible-by 128 \
    --lr 3.0e-4 --min-lr 3.0e-5 --lr-decay-style cosine --lr-warmup-iters 2000 \
    --weight-decay 0.1 --clip-grad 1.0 --adam-beta1 0.9 --adam-beta2 0.95 \
    --init-method-std 0.01 --seed 1234 \
    --train-iters 100000 \
    --data-path /data/llama3/dclm_text_document --split 99,1,0 \
    --save /checkpoints/llama3-8b --load /checkpoints/llama3-8b --save-interval 1000 \
    --log-interval 10 --eval-interval 1000 --eval-iters 10 \
    --tensorboard-dir /checkpoints/llama3-8b/tb \
    --distributed-backend nccl --distributed-timeout-minutes 60
