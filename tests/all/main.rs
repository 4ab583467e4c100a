mod rule_languages;
mod rules;
