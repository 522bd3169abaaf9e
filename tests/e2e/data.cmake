# End-to-end checks of `llmtrain data`: the Megatron format read and written by an independent
# numpy reader (check_megatron_format.py), and the exit codes of usage (2) and runtime (1) errors.
# Included from tests/e2e/CMakeLists.txt, where the binary target is `llmtrain`.
add_test(NAME e2e_data_megatron_format
         COMMAND ${LLMT_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/check_megatron_format.py
                 --llmtrain $<TARGET_FILE:llmtrain> --workdir ${CMAKE_CURRENT_BINARY_DIR}/work/data_format)
set_tests_properties(e2e_data_megatron_format PROPERTIES LABELS e2e TIMEOUT 300)

add_test(NAME e2e_data_help COMMAND $<TARGET_FILE:llmtrain> data --help)
set_tests_properties(e2e_data_help PROPERTIES LABELS e2e
                     PASS_REGULAR_EXPRESSION "tokenizer-train.*prepare.*inspect")

set(_check ${CMAKE_CURRENT_LIST_DIR}/bad_configs/check.sh)
set(_missing ${CMAKE_CURRENT_BINARY_DIR}/work/no_such_dataset)
add_test(NAME e2e_data_prepare_missing_input
         COMMAND bash ${_check} 2 "--input: File does not exist: .*no_such.txt" --
                 $<TARGET_FILE:llmtrain> data prepare --input ${_missing}/no_such.txt
                 --tokenizer ${_missing}/tok.model --output ${_missing}/out)
add_test(NAME e2e_data_prepare_output_is_a_prefix
         COMMAND bash ${_check} 2 "--output x.bin is a prefix: .bin is added \\(write --output x\\)" --
                 $<TARGET_FILE:llmtrain> data prepare --input ${CMAKE_CURRENT_LIST_FILE}
                 --tokenizer ${CMAKE_CURRENT_LIST_FILE} --output x.bin)
add_test(NAME e2e_data_tokenizer_train_bad_model_type
         COMMAND bash ${_check} 2 "--model-type: word not in \\{bpe,unigram\\}" --
                 $<TARGET_FILE:llmtrain> data tokenizer-train --input ${CMAKE_CURRENT_LIST_FILE}
                 --vocab-size 100 --model-type word --output ${_missing}/tok.model)
add_test(NAME e2e_data_inspect_verify_without_vocab
         COMMAND bash ${_check} 2 "--verify checks token ids against a vocabulary: give --tokenizer or --vocab-size" --
                 $<TARGET_FILE:llmtrain> data inspect ${_missing}/ds --verify)
add_test(NAME e2e_data_inspect_missing_dataset
         COMMAND bash ${_check} 1 "error: .*no_such_dataset/ds.idx: cannot open: No such file or directory" --
                 $<TARGET_FILE:llmtrain> data inspect ${_missing}/ds)
set_tests_properties(e2e_data_prepare_missing_input e2e_data_prepare_output_is_a_prefix
                     e2e_data_tokenizer_train_bad_model_type e2e_data_inspect_verify_without_vocab
                     e2e_data_inspect_missing_dataset PROPERTIES LABELS e2e)
