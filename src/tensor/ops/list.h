/* tensor/ops/list.h: every differentiable op, once.
 *
 * X(NAME, name): the op CDDP_OP_NAME, whose backward is cddp__name_backward (defined in its
 * family's file beside the forward, src/tensor/ops/<family>.c). The enum, the backward table
 * (ops/dispatch.c) and the ops' names come from this list; adding an op is its family's code
 * plus one line here.
 */
#ifndef CDDP_TENSOR_OPS_LIST_H
#define CDDP_TENSOR_OPS_LIST_H

#define CDDP_OP_LIST(X)                                                                            \
    X(RESHAPE, reshape) /* shape.c */                                                              \
    X(TO_DTYPE, to_dtype)                                                                          \
    X(TO_BLOCKED, to_blocked) /* layout.c */                                                       \
    X(TO_NCHW, to_nchw)                                                                            \
    X(TO_DEVICE, to_device) /* device.c */                                                         \
    X(MATMUL, matmul)       /* linear.c */                                                         \
    X(LINEAR, linear)                                                                              \
    X(GELU_TANH_LINEAR, gelu_tanh_linear)                                                          \
    X(ADD, add) /* elementwise.c */                                                                \
    X(SUB, sub)                                                                                    \
    X(MUL, mul)                                                                                    \
    X(DIV, div)                                                                                    \
    X(SCALE, scale)                                                                                \
    X(RELU, relu) /* activation.c */                                                               \
    X(GELU, gelu)                                                                                  \
    X(TANH, tanh)                                                                                  \
    X(SIGMOID, sigmoid)                                                                            \
    X(SOFTMAX, softmax)                                                                            \
    X(LOG_SOFTMAX, log_softmax)                                                                    \
    X(CROSS_ENTROPY, cross_entropy) /* loss.c */                                                   \
    X(MSE, mse)                                                                                    \
    X(SUM, sum) /* reduce.c */                                                                     \
    X(MEAN, mean)                                                                                  \
    X(CONV2D, conv2d) /* conv.c */                                                                 \
    X(CONV2D_RELU_MAX_POOL2D, conv2d_relu_max_pool2d)                                              \
    X(MAX_POOL2D, max_pool2d) /* pool.c */                                                         \
    X(RELU_MAX_POOL2D, relu_max_pool2d)                                                            \
    X(AVG_POOL2D, avg_pool2d)                                                                      \
    X(ADAPTIVE_AVG_POOL2D, adaptive_avg_pool2d)                                                    \
    X(DROPOUT, dropout)       /* dropout.c */                                                      \
    X(BATCH_NORM, batch_norm) /* norm.c */                                                         \
    X(BATCH_NORM_RELU, batch_norm_relu)                                                            \
    X(BATCH_NORM_ADD_RELU, batch_norm_add_relu)                                                    \
    X(EMBEDDING, embedding) /* transformer.c */                                                    \
    X(LAYER_NORM, layer_norm)                                                                      \
    X(GELU_TANH, gelu_tanh)                                                                        \
    X(ATTENTION, attention)                                                                        \
    X(QKV_ATTENTION, qkv_attention)                                                                \
    X(RMS_NORM, rms_norm) /* llama.c */                                                            \
    X(SILU_MUL, silu_mul)                                                                          \
    X(ROPE, rope)                                                                                  \
    X(QKV_PACK, qkv_pack)                                                                          \
    X(FUNCTION, function) /* function.c */

#endif
