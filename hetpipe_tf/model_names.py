"""The names `hetpipe_tf.models.build_model` takes, without importing Keras: binaries define
their `--model` flags from them, so a bad flag is refused before TensorFlow starts."""

APPLICATIONS = ("resnet101", "resnet152", "resnet50", "vgg16", "vgg19")
SMALL = ("gpt_decoder", "mlp", "resnet50_transfer", "small_cnn", "small_resnet")
MODEL_NAMES = APPLICATIONS + SMALL
