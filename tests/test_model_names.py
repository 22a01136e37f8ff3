"""hetpipe_tf/model_names.py lists exactly the models hetpipe_tf/models.py builds."""

import pytest

from hetpipe_tf import model_names, models


def test_the_names_are_the_models_built():
    assert set(model_names.APPLICATIONS) == set(models._APPLICATIONS)
    assert set(model_names.SMALL) == set(models._SMALL)
    assert models.MODEL_NAMES == model_names.MODEL_NAMES


def test_an_unknown_name_is_refused_with_the_names():
    with pytest.raises(ValueError, match="vgg19"):
        models.build_model("no_such_model")
