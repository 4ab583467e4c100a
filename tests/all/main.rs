mod embedded_queue;
mod rule_languages;
mod rules;
